"""The RDMA device model: config space, control commands, events and per-VM objects.

It never touches sockets or file descriptors: the vhost-user layer hands it command bytes and takes back
response bytes and events.
"""
