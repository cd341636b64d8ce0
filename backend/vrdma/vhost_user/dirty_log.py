"""The dirty log of a migrating VM's memory: the bitmap the frontend shares with VHOST_USER_SET_LOG_BASE
(VHOST_USER_PROTOCOL_F_LOG_SHMFD), a bit per 4 KiB guest-physical page from address 0, in which a back-end marks every
page it writes while QEMU copies the VM's RAM, so that QEMU copies those pages again.

The protocol layer owns the message (libvhost-user of QEMU 10.0 maps whatever size it is given without checking the
result, and then asserts, aborting the process, on a write past it): the mapping is checked here, marks are atomic
and bounded by the log's size (vrdma_log_mark in the glue), and the device model is told the log's address for what
it writes itself (docs/migration.md).
"""

from __future__ import annotations

import ctypes
import fcntl
import mmap
import os
import struct

from vrdma.vhost_user import protocol

LOG = struct.Struct("<QQ")  # VhostUserLog: mmap_size, mmap_offset
MAX_LOG_SIZE = 1 << 30      # bytes of bitmap: 32 TiB of guest-physical space (QEMU's for a 1 GiB guest: 32 KiB)


class DirtyLog:
    """One log the frontend shared, mapped here. Refused (protocol.BadPayload) when it is empty, larger than
    MAX_LOG_SIZE, not at a page-aligned offset, past the end of its file, or in a file that can shrink under us (QEMU
    seals its log memfd against shrinking, as guest RAM is)."""

    def __init__(self, fd: int, size: int, offset: int) -> None:
        if not 0 < size <= MAX_LOG_SIZE or offset % mmap.PAGESIZE:
            raise protocol.BadPayload(f"SET_LOG_BASE of {size} bytes at offset {offset:#x} (1 to {MAX_LOG_SIZE} "
                                      "bytes, at a page-aligned offset)")
        try:
            seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
            length = os.fstat(fd).st_size
        except OSError as err:
            raise protocol.BadPayload(f"SET_LOG_BASE with a descriptor that is not a sealed memfd: {err}") from None
        if not seals & fcntl.F_SEAL_SHRINK:
            raise protocol.BadPayload("SET_LOG_BASE with a log file that can shrink (no F_SEAL_SHRINK)")
        if offset + size > length:
            raise protocol.BadPayload(f"SET_LOG_BASE of {size} bytes at offset {offset:#x} past the end of its "
                                      f"{length}-byte file")
        self.size = size
        self.map = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE, offset=offset)
        self._view = ctypes.c_char.from_buffer(self.map)  # (holds the map open: close() lets go of it first)
        self.address = ctypes.addressof(self._view)

    def close(self) -> None:
        del self._view
        self.map.close()
