"""The vhost-user layer: the protocol (wire structs, one dispatch), the device side of a connection (memory table,
vrings, libvhost-user through cffi) and the event loop. It knows nothing of RDMA: a device model plugs in behind
the small interface vhost_user.device.DeviceModel declares."""
