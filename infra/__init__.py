"""The Pulumi program: ACK Pro + Lingjun nodes, the RDMA device plugin, sample RDMA Jobs."""
