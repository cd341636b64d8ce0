"""The VM harness: boot QEMU guests, wait for them to be ready, run commands in them, shut them down.

- ``vm.Vm``: one guest as a context manager;
- ``cluster.Cluster``: several guests joined by a private link;
- ``agent.GuestAgent``: commands in a guest through qemu-guest-agent;
- ``session``: guests kept running in the background for the ``vrdma vm`` commands.
"""
