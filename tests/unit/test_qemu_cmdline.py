"""The QEMU command line template in qemu-configs/ and how the harness fills it in."""

from __future__ import annotations

from pathlib import Path

import pytest

from vrdma.errors import VrdmaError
from vrdma.harness import qemu_cmdline
from vrdma.harness.qemu_cmdline import GuestIdentity


def test_guest_identities_are_on_the_private_link() -> None:
    assert [GuestIdentity(i).name for i in range(3)] == ["vm0", "vm1", "vm2"]
    assert GuestIdentity(0).address == "169.254.100.1/24"
    assert GuestIdentity(1).ip == "169.254.100.2"
    assert len({GuestIdentity(i).mac for i in range(8)}) == 8


def test_template_parses_options_values_and_comments(tmp_path: Path) -> None:
    template = tmp_path / "t.args"
    template.write_text("# header\n\n-nodefaults   # comment\n-append console=ttyS0 x=${x}\n-m ${m}M\n")
    assert qemu_cmdline.load_template(template) == [
        ("-nodefaults", None), ("-append", "console=ttyS0 x=${x}"), ("-m", "${m}M")]
    assert qemu_cmdline.render({"x": "1", "m": "512"}, template) == [
        "-nodefaults", "-append", "console=ttyS0 x=1", "-m", "512M"]


def test_missing_field_is_named(tmp_path: Path) -> None:
    template = tmp_path / "t.args"
    template.write_text("-m ${memory}M\n")
    with pytest.raises(VrdmaError, match="no value for field 'memory'"):
        qemu_cmdline.render({}, template)


def test_line_that_is_not_an_option_is_rejected(tmp_path: Path) -> None:
    template = tmp_path / "t.args"
    template.write_text("nodefaults\n")
    with pytest.raises(VrdmaError, match=r"t.args:1: expected an option"):
        qemu_cmdline.load_template(template)


def test_project_template_has_the_devices_the_harness_relies_on() -> None:
    options = qemu_cmdline.load_template()
    values = " ".join(v or "" for _, v in options)
    assert ("-nodefaults", None) in options
    assert "memory-backend-memfd,id=mem,size=${memory}M,share=on" in values
    assert "name=org.qemu.guest_agent.0" in values
    assert dict(options).get("-netdev") == "${netdev}"


def test_the_guest_link_is_the_private_link_or_a_hosts_tap() -> None:
    """The netdev field: unix datagram sockets between the guests by default; a tap made beforehand on a host of
    several (vrdma.harness.multihost), whose guest also gets its address and gateway on the kernel command line."""
    products = {"qemu": {"firmware_dirs": ["/q", "/b"]}, "kernel": {"vmlinuz_path": "/k"},
                "image": {"initrd_path": "/i"}}
    common = {"accel": "tcg", "memory_mib": 512, "directory": Path("/run/vm1"), "link_remote": "/run/vm0/link.sock"}
    private = qemu_cmdline.standard_fields(GuestIdentity(1), **products, **common)
    assert private["netdev"] == ("dgram,id=link,local.type=unix,local.path=/run/vm1/link.sock,remote.type=unix,"
                                 "remote.path=/run/vm0/link.sock")
    ident = GuestIdentity(1, cidr="10.99.1.3/24", gateway="10.99.1.1")
    tap = qemu_cmdline.standard_fields(ident, **products, **common, tap="tap1")
    assert tap["netdev"] == "tap,id=link,ifname=tap1,script=no,downscript=no"
    assert "vrdma_guest.addr=10.99.1.3/24" in tap["append"] and "vrdma_guest.gw=10.99.1.1" in tap["append"]
    assert ident.ip == "10.99.1.3"


def test_kernel_command_line_carries_the_guest_parameters() -> None:
    line = qemu_cmdline.kernel_append(GuestIdentity(1), "extra=1")
    assert "console=ttyS0" in line and "panic=-1" in line
    assert "vrdma_guest.name=vm1" in line and "vrdma_guest.addr=169.254.100.2/24" in line
    assert line.endswith("extra=1")


def test_the_vrdma_device_is_one_named_device_or_the_generic_pair() -> None:
    """The default: `vhost-user-rdma-pci` on the backend's socket, nothing else; the generic form for QEMUs without
    it: the generic vhost-user device with ID 42 and the doorbell file as an ivshmem device."""
    products = {"qemu": {"firmware_dirs": ["/q", "/b"]}, "kernel": {"vmlinuz_path": "/k"},
                "image": {"initrd_path": "/i"}}
    fields = qemu_cmdline.standard_fields(GuestIdentity(0), **products, accel="tcg", memory_mib=512,
                                          directory=Path("/run/vm0"), link_remote="/run/vm1/link.sock")
    fields.update(console="fd=3", qmp="fd=4", agent="fd=5")
    base = qemu_cmdline.render_guest(fields, with_device=False)
    named = qemu_cmdline.render_guest(fields, with_device=True)[len(base):]
    assert named == ["-chardev", "socket,id=vrdma,path=/run/vm0/vrdma.sock,reconnect-ms=1000",
                     "-device", "vhost-user-rdma-pci,id=vrdma0,chardev=vrdma"]
    generic = qemu_cmdline.render_guest(fields, with_device=True, device="generic")[len(base):]
    assert "vhost-user-device-pci,id=vrdma0,chardev=vrdma,virtio-id=42,num_vqs=3,config_size=96" in generic
    assert "memory-backend-file,id=vrdma-doorbell,mem-path=/run/backend/vm0.doorbell,size=4194304,share=on" \
        in generic
