"""The files through which a container's unmodified libibverbs finds its vrdma device (docs/containers.md).

A host without the kernel's RDMA core has no /sys/class/infiniband: libibverbs, finding no RDMA netlink either,
reads the sysfs tree under $SYSFS_PATH (default /sys). ``write_tree`` writes the part of that tree one device
needs into a directory the container mounts as its /sys (or names with SYSFS_PATH):

    class/infiniband_verbs/abi_version              the uverbs ABI libibverbs accepts
    class/infiniband_verbs/uverbs0/{ibdev,dev,abi_version}
    class/infiniband/<device>/{node_type,node_guid,vrdma_socket}
    class/infiniband/<device>/device/modalias       "vrdma:channel": libvrdma's channel mode
    class/infiniband/<device>/ports/1/gids/N        the container's GID at 0, the rest of the table empty
    class/infiniband/<device>/ports/1/gid_attrs/types/N, ports/1/pkeys/0

`dev` names /dev/null's numbers (1:3): libibverbs opens /dev/infiniband/uverbs0 and insists on a character device
with the numbers the tree gives, and a container gets /dev/null there (a bind mount, or a runtime's device
option); libvrdma never sends a command through it. `vrdma_socket` is where the container sees the backend's socket.
"""

from __future__ import annotations

import re
from pathlib import Path

from vrdma.device import abi
from vrdma.device.gid import gid_of_address, gid_text
from vrdma.device.params import DEFAULT_LIMITS
from vrdma.errors import VrdmaError

UVERBS_ABI = 6        # the uverbs ABI this libibverbs class directory speaks (libibverbs accepts 3 to 6)
NULL_DEVICE = "1:3"   # /dev/null's numbers
DEVICE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


class ContainerFilesError(VrdmaError):
    """A device name, address or path the files cannot be written for."""


def address_gid_text(address: str) -> str:
    """The GID of an IP address (IPv4: mapped into IPv6) as sysfs writes it."""
    try:
        return gid_text(gid_of_address(address))
    except ValueError:
        raise ContainerFilesError(f"{address!r} is not an IP address") from None


def write_tree(directory: Path, device: str, address: str, socket_path: str, node_guid: int = 0x0276720000000001,
               gid_table_len: int = DEFAULT_LIMITS.gid_table_len) -> None:
    """The tree of one device named ``device`` (what ibv_devices lists) for a container whose address is
    ``address``, whose backend socket the container sees at ``socket_path``, into ``directory``."""
    if not DEVICE_NAME.fullmatch(device):
        raise ContainerFilesError(f"device name {device!r}: 1 to 64 letters, digits, '_', '.', '-'")
    if not socket_path.startswith("/") or "\n" in socket_path:
        raise ContainerFilesError(f"socket path {socket_path!r} must be absolute (as the container sees it)")
    gid, empty = address_gid_text(address), gid_text(bytes(16))
    verbs = directory / "class" / "infiniband_verbs"
    ibdev = directory / "class" / "infiniband" / device
    port = ibdev / "ports" / "1"
    files = {
        verbs / "abi_version": str(UVERBS_ABI),
        verbs / "uverbs0" / "ibdev": device,
        verbs / "uverbs0" / "dev": NULL_DEVICE,
        verbs / "uverbs0" / "abi_version": str(abi.user_abi().const("VRDMA_UVERBS_ABI_VERSION")),
        ibdev / "node_type": "1: CA",
        ibdev / "node_guid": ":".join(f"{node_guid:016x}"[i:i + 4] for i in range(0, 16, 4)),
        ibdev / "vrdma_socket": socket_path,
        ibdev / "device" / "modalias": "vrdma:channel",
        port / "pkeys" / "0": "0xffff",
    }
    for index in range(gid_table_len):
        files[port / "gids" / str(index)] = gid if index == 0 else empty
        files[port / "gid_attrs" / "types" / str(index)] = "RoCE v2"
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")
