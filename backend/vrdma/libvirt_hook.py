"""libvirt's QEMU hook for vrdma: the VM is added to the backend before its QEMU starts and removed when it is gone.

libvirt runs ``/etc/libvirt/hooks/qemu GUEST OPERATION SUB-OPERATION EXTRA`` with the domain's XML on standard
input (https://libvirt.org/hooks.html). Installed as that file (packaging/libvirt/qemu-hook runs `vrdma
libvirt-hook "$@"`), it acts on two moments of a domain that has a vrdma device (a ``vhost-user-rdma-pci`` in its
``qemu:commandline``):

- ``prepare begin``: `vm-add` the guest under its domain name, with the chardev's socket path and the MAC of its
  first virtio NIC; a backend that refuses stops the domain's start (libvirt shows the reason);
- ``release end``: `vm-remove` it (a VM the backend no longer serves is no error: it may have been restarted).

Any other call, or a domain without a vrdma device, does nothing and succeeds.
"""

from __future__ import annotations

import logging
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vrdma.daemon.admin import ask
from vrdma.errors import VrdmaError

log = logging.getLogger(__name__)

QEMU_NS = "{http://libvirt.org/schemas/domain/qemu/1.0}"


class HookError(VrdmaError):
    """The domain's definition or the backend's answer does not let the VM start."""


@dataclass(frozen=True)
class VrdmaGuest:
    name: str
    socket_path: str
    mac: str | None


def vrdma_guest(domain_xml: str) -> VrdmaGuest | None:
    """The vrdma device of a domain definition, or None when it has none."""
    try:
        root = ET.fromstring(domain_xml)
    except ET.ParseError as err:
        raise HookError(f"the domain XML libvirt gave is not XML: {err}") from err
    args = [arg.get("value", "") for arg in root.iter(f"{QEMU_NS}arg")]
    devices = [value for value in args if value.split(",", 1)[0] == "vhost-user-rdma-pci"]
    if not devices:
        return None
    chardev_id = _option(devices[0], "chardev")
    sockets = [value for value in args if value.startswith("socket,") and _option(value, "id") == chardev_id]
    path = _option(sockets[0], "path") if sockets else None
    if chardev_id is None or path is None:
        raise HookError("the domain's vhost-user-rdma-pci has no chardev with a socket path in its qemu:commandline")
    name = root.findtext("name")
    if not name:
        raise HookError("the domain has no name")
    nic = next((iface for iface in root.iter("interface")
                if (model := iface.find("model")) is not None and model.get("type") == "virtio"), None)
    mac_element = nic.find("mac") if nic is not None else None
    return VrdmaGuest(name, path, mac_element.get("address") if mac_element is not None else None)


def _option(value: str, key: str) -> str | None:
    for part in value.split(",")[1:]:
        name, sep, text = part.partition("=")
        if sep and name == key:
            return text
    return None


def run(argv: list[str], domain_xml: str, admin_socket: Path) -> int:
    """The hook: ``argv`` as libvirt gives it (guest, operation, sub-operation, extra)."""
    if len(argv) < 3:
        raise HookError(f"expected GUEST OPERATION SUB-OPERATION [EXTRA] from libvirt, got {argv!r}")
    operation, sub_operation = argv[1], argv[2]
    if (operation, sub_operation) not in (("prepare", "begin"), ("release", "end")):
        return 0
    guest = vrdma_guest(domain_xml)
    if guest is None:
        return 0
    if operation == "prepare":
        request: dict[str, Any] = {"command": "vm-add", "name": guest.name, "socket-path": guest.socket_path}
        if guest.mac:
            request["mac"] = guest.mac
        reply = _ask(admin_socket, request)
        if not reply.get("ok"):
            raise HookError(f"the vrdma backend refused to serve {guest.name}: {reply.get('error')}")
        log.info("%s: served by the vrdma backend on %s", guest.name, guest.socket_path)
    else:
        reply = _ask(admin_socket, {"command": "vm-remove", "name": guest.name})
        if not reply.get("ok"):
            log.info("%s: %s", guest.name, reply.get("error"))
    return 0


def _ask(admin_socket: Path, request: dict[str, Any]) -> dict[str, Any]:
    try:
        return ask(admin_socket, request)
    except OSError as err:
        raise HookError(f"cannot reach the vrdma backend's admin socket {admin_socket}: {err} (is vrdma-backend "
                        "running? systemctl status vrdma-backend)") from err
