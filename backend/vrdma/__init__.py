"""vrdma: a paravirtual RDMA NIC for QEMU/KVM guests, served by a vhost-user backend process."""

__version__ = "0.1.0"
