"""The container channel: a host process's transport to a device (guest-driver/include/vrdma_channel.h).

Like the vhost-user layer it carries a device's bytes and memory and knows nothing of RDMA: messages in and out of a
SOCK_SEQPACKET unix socket, descriptors in SCM_RIGHTS, the process's memfds mapped here. What the bytes mean is the
model's (vrdma.daemon.container).
"""
