"""Kubernetes plumbing: the API client, CDI specs, the Node's Events, the kubelet's sockets
and the instance lock."""
