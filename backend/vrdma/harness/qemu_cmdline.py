"""QEMU command lines built from the readable template in ``qemu-configs/guest.args``.

The template is the one source of truth: the harness fills it in to run guests, and ``vrdma vm cmdline``
fills it in for a person (with path sockets instead of inherited file descriptors).
"""

from __future__ import annotations

import re
import shlex
import string
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from vrdma import paths
from vrdma.device import abi
from vrdma.device.params import DEFAULT_LIMITS
from vrdma.errors import VrdmaError

TEMPLATE_NAME = "guest.args"
# Appended for guests with a vrdma device: the named device (the default), or the generic vhost-user device with
# an ivshmem device for the doorbell region (how a QEMU without vhost-user-rdma-pci gives it).
DEVICE_TEMPLATES = {"rdma": "vrdma-device.args", "generic": "vrdma-device-generic.args"}
DEVICE_TEMPLATE_NAME = DEVICE_TEMPLATES["rdma"]
LINK_NET = "169.254.100"  # the guests' private link: vm0 is .1, vm1 is .2, ...
LINK_PREFIX = 24
DOORBELL_SIZE = DEFAULT_LIMITS.doorbell_pages * abi.const("VRDMA_DOORBELL_PAGE_SIZE")
CONFIG_SIZE = abi.sizeof("vrdma_config")
NUM_QUEUES = abi.const("VRDMA_NUM_QUEUES")


@dataclass(frozen=True)
class GuestIdentity:
    """Name and link addresses of guest number ``index``: on the private guest link by default; a guest on a host
    of several (vrdma.harness.multihost) has ``cidr`` on its host's bridge and ``gateway`` its way out."""

    index: int
    cidr: str | None = None
    gateway: str | None = None

    @property
    def name(self) -> str:
        return f"vm{self.index}"

    @property
    def ip(self) -> str:
        return self.cidr.split("/")[0] if self.cidr else f"{LINK_NET}.{self.index + 1}"

    @property
    def address(self) -> str:
        return self.cidr or f"{self.ip}/{LINK_PREFIX}"

    @property
    def mac(self) -> str:
        # 52:54:00 is QEMU's locally administered prefix; "vr" in the next two bytes marks vrdma guests.
        return f"52:54:00:76:72:{self.index:02x}"


def kernel_append(identity: GuestIdentity, extra: str = "") -> str:
    """The guest kernel command line; the vrdma.* parameters are read by the image's start-up script."""
    parts = ["console=ttyS0", "panic=-1", "quiet", f"vrdma_guest.name={identity.name}",
             f"vrdma_guest.addr={identity.address}"]
    if identity.gateway:
        parts.append(f"vrdma_guest.gw={identity.gateway}")
    if extra:
        parts.append(extra)
    return " ".join(parts)


_COMMENT = re.compile(r"(^|\s)#.*$")


def load_template(path: Path | None = None) -> list[tuple[str, str | None]]:
    """Parse the template into (option, value-or-None) pairs."""
    path = path or paths.qemu_configs_dir() / TEMPLATE_NAME
    pairs: list[tuple[str, str | None]] = []
    for lineno, raw in enumerate(path.read_text().splitlines(), 1):
        line = _COMMENT.sub("", raw).strip()
        if not line:
            continue
        option, _, value = line.partition(" ")
        if not option.startswith("-"):
            raise VrdmaError(f"{path}:{lineno}: expected an option starting with '-', got {option!r}")
        pairs.append((option, value.strip() or None))
    return pairs


def render_pairs(fields: Mapping[str, str], template: Path | None = None) -> list[tuple[str, str | None]]:
    """(option, value) pairs with every ${field} filled in; a field without a value is an error."""
    pairs: list[tuple[str, str | None]] = []
    for option, value in load_template(template):
        try:
            pairs.append((option, None if value is None else string.Template(value).substitute(fields)))
        except KeyError as err:
            raise VrdmaError(f"{TEMPLATE_NAME}: no value for field {err} in {option} {value}") from None
    return pairs


def render(fields: Mapping[str, str], template: Path | None = None) -> list[str]:
    """The argument vector (without the program) with every ${field} filled in."""
    return [arg for option, value in render_pairs(fields, template)
            for arg in ((option,) if value is None else (option, value))]


DISK_TEMPLATE_NAME = "guest-disk.args"


def render_guest(fields: Mapping[str, str], with_device: bool, device: str = "rdma") -> list[str]:
    """A guest's arguments: guest.args, its root disk (guest-disk.args) when ``fields`` name one, then its vrdma
    device's template (``device``: a key of DEVICE_TEMPLATES) when it has one."""
    argv = render(fields)
    if "disk" in fields:
        argv += render(fields, paths.qemu_configs_dir() / DISK_TEMPLATE_NAME)
    if with_device:
        argv += render(fields, paths.qemu_configs_dir() / DEVICE_TEMPLATES[device])
    return argv


def render_for_person(guests: int) -> str:
    """Shell command lines for ``guests`` guests as a person would run them by hand, with path sockets."""
    from vrdma.buildchain.cache import product

    qemu, kernel, image = product("qemu"), product("kernel"), product("image")
    run = "/tmp/vrdma-guests"
    names = " ".join(f"--socket-path vm{i}={run}/vm{i}/vrdma.sock --mac vm{i}={GuestIdentity(i).mac}"
                     for i in range(guests))
    lines = [f"mkdir -p {run}/backend " + " ".join(f"{run}/vm{i}" for i in range(guests)),
             "# the vrdma backend must listen before QEMU starts",
             f"{shlex.quote(str(paths.project_root() / '.venv' / 'bin' / 'vrdma'))} backend {names} "
             f"--doorbell-dir {run}/backend &"]
    for index in range(guests):
        ident = GuestIdentity(index)
        d = f"{run}/{ident.name}"
        fields = standard_fields(ident, qemu=qemu, kernel=kernel, image=image, accel="tcg", memory_mib=1024,
                                 directory=Path(d), link_remote=_person_link_remote(run, index, guests))
        fields.update(console=f"path={d}/console.sock", qmp=f"path={d}/qmp.sock", agent=f"path={d}/agent.sock")
        fields.update(vrdma_socket=f"{d}/vrdma.sock", vrdma_doorbell=f"{run}/backend/{ident.name}.doorbell")
        pairs = render_pairs(fields) + render_pairs(fields, paths.qemu_configs_dir() / DEVICE_TEMPLATE_NAME)
        options = [o if v is None else f"{o} {shlex.quote(v)}" for o, v in pairs]
        lines.append(" \\\n    ".join([shlex.quote(str(qemu["binary_path"])), *options]) + " &")
    if guests > 2:
        lines.insert(0, "# more than two guests need the link hub: `vrdma vm up` runs it for you")
    return "\n".join(lines)


def _person_link_remote(run: str, index: int, guests: int) -> str:
    if guests == 2:
        return f"{run}/vm{1 - index}/link.sock"
    return f"{run}/hub/port{index}.sock"


def standard_fields(ident: GuestIdentity, *, qemu: Mapping[str, object], kernel: Mapping[str, object],
                    image: Mapping[str, object], accel: str, memory_mib: int, directory: Path,
                    link_remote: str, append_extra: str = "", tap: str | None = None, cpus: int = 1,
                    vrdma_socket: Path | None = None) -> dict[str, str]:
    """Every template field but the three chardev addresses (console, qmp, agent). ``tap``: the guest's netdev is
    that tap device (made beforehand, in the network namespace QEMU runs in) instead of the private link; ``cpus``:
    its vCPUs; ``vrdma_socket``: the backend's socket, if not in ``directory`` (a migration's destination connects to
    its source's)."""
    link = (f"tap,id=link,ifname={tap},script=no,downscript=no" if tap else
            f"dgram,id=link,local.type=unix,local.path={directory / 'link.sock'},remote.type=unix,"
            f"remote.path={link_remote}")
    firmware = [str(d) for d in qemu["firmware_dirs"]]  # type: ignore[attr-defined]
    return {
        "name": ident.name,
        "accel": accel,
        "cpu": "host" if accel == "kvm" else "max",
        "memory": str(memory_mib),
        "cpus": str(cpus),
        "firmware_qemu": firmware[0],
        "firmware_bios": firmware[1],
        "kernel": str(kernel["vmlinuz_path"]),
        "initrd": str(image["initrd_path"]),
        "append": kernel_append(ident, append_extra),
        "console_log": str(directory / "console.log"),
        "netdev": link,
        "mac": ident.mac,
        "vrdma_socket": str(vrdma_socket or directory / "vrdma.sock"),
        "vrdma_doorbell": str(directory.parent / "backend" / f"{ident.name}.doorbell"),
        "vrdma_doorbell_size": str(DOORBELL_SIZE),
        "vrdma_config_size": str(CONFIG_SIZE),
        "vrdma_num_queues": str(NUM_QUEUES),
    }
