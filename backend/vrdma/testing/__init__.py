"""Testing tools shipped with the package: the simulated vhost-user frontend (a stand-in for QEMU and a guest)."""
