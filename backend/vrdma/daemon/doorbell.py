"""The doorbell region of one VM: a shared-memory file the backend creates and QEMU maps as ivshmem-plain BAR2.

Page 0 holds ``struct vrdma_doorbell_header`` (magic, pairing identifier, ABI version, geometry); the driver
finds its ivshmem device by the pairing identifier it also reads from the virtio config space. Later pages
are the user contexts' doorbell pages.

The region belongs to the VM, not to one backend process: QEMU maps the file for the VM's lifetime, so a
restarted backend opens the same file (never a new inode) and keeps its pairing identifier, and no backend
removes it on exit. Whoever created the VM's run directory removes it with the VM.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import secrets
from pathlib import Path

from vrdma.device import abi

HEADER_SIZE = abi.sizeof("vrdma_doorbell_header")


class DoorbellRegion:
    """The file stays open for the region's lifetime: if QEMU (which opens it by path) truncates it, ``restore``
    gives the same inode its size back and maps it again at the same address (the data engine holds that address).
    """

    def __init__(self, path: Path | None, size: int, handed_over: int | None = None) -> None:
        """``handed_over``: the region's file, open already (a backend upgrade: the one the guest has mapped, which
        must be a region of this size with its header; the path is only its name). No ``path``: a region no file
        names (a container's, whose processes are given its descriptor), sealed at its size: a process that maps
        it can neither shrink it under the engine nor grow it."""
        if size <= 0 or size & (size - 1):
            raise ValueError(f"ivshmem needs a power-of-two region size, not {size}")
        self.size = size
        if handed_over is not None:
            self.fd = handed_over
        elif path is None:
            self.fd = os.memfd_create("vrdma-doorbells", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
            os.ftruncate(self.fd, size)
            fcntl.fcntl(self.fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
        else:
            # O_NOFOLLOW: the run directory is shared with QEMU, which must not point the backend at another file.
            self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        self.path = path if path is not None else Path(f"/proc/{os.getpid()}/fd/{self.fd}")  # (a memfd's name)
        try:
            if os.fstat(self.fd).st_size != size:
                os.ftruncate(self.fd, size)
            self.map = mmap.mmap(self.fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(self.fd)
            raise
        header = abi.from_bytes("vrdma_doorbell_header", self.map[:HEADER_SIZE])
        if (header.magic == abi.const("VRDMA_DOORBELL_MAGIC") and header.num_pages * header.page_size == size
                and header.pairing_id):
            self.pairing_id = int(header.pairing_id)
            self.reused = True
        elif handed_over is not None:
            self.map.close()
            os.close(self.fd)
            raise ValueError(f"the doorbell region handed over for {path} is not one of {size} bytes with its header")
        else:
            self.pairing_id = secrets.randbits(64) or 1
            self.reused = False

    @property
    def address(self) -> int:
        """Where the region is mapped in this process."""
        from vrdma.faultguard import ffi

        return int(ffi.cast("uintptr_t", ffi.from_buffer(self.map)))

    def write_header(self, header: bytes) -> None:
        self.map[:len(header)] = header

    def restore(self) -> None:
        """After a truncation: the file gets its size back (zero-filled) and is mapped again where it was (a sealed
        region cannot be truncated)."""
        from vrdma.faultguard import remap_shared

        os.ftruncate(self.fd, self.size)
        remap_shared(self.address, self.size, self.fd)

    def close(self) -> None:
        self.map.close()
        os.close(self.fd)
