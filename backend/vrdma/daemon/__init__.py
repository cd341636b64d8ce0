"""The vrdma backend process: vhost-user devices (one per VM) joined to the RDMA device model."""
