"""The Pulumi components: network, cluster, node agent, Jobs, monitoring."""
