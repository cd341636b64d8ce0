"""The doorbell region of one VM: a shared-memory file the backend creates and QEMU maps as ivshmem-plain BAR2.

Page 0 holds ``struct vrdma_doorbell_header`` (magic, pairing identifier, ABI version, geometry); the driver
finds its ivshmem device by the pairing identifier it also reads from the virtio config space. Later pages
are the user contexts' doorbell pages.
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path


class DoorbellRegion:
    def __init__(self, path: Path, size: int, header: bytes) -> None:
        if size <= 0 or size & (size - 1):
            raise ValueError(f"ivshmem needs a power-of-two region size, not {size}")
        self.path = path
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            os.ftruncate(fd, size)
            self.map = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        self.map[:len(header)] = header

    def close(self) -> None:
        self.map.close()
        self.path.unlink(missing_ok=True)
