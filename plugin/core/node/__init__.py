"""The node's RDMA state: discovery, pools (pure policy), health and the kernel's events."""
