"""Containers for tests and benchmarks: host processes with the guest image's programs, each container's
vrdma device reached through the backend's container channel (docs/containers.md).

A container here is what a runtime would make of it, with nothing but `ip netns` and `unshare`:
- its root: the guest image's root filesystem (Debian's ibverbs-utils, perftest, pyverbs and libvrdma), unpacked
  once (``root_filesystem``) and shared read-only by every container;
- a network namespace of its own, its `eth0` a veth port of a host's guest bridge (vrdma.harness.multihost),
  with the container's address in the host's guest subnet;
- for every command, fresh mount and PID namespaces: a tmpfs /sys holding its device's files (written by
  vrdma.container_files), its backend socket bind-mounted at /run/vrdma/<device>.sock, /dev/null as
  /dev/infiniband/uverbs0, a private /tmp; then chroot.

It is added to the host's backend (`container-add`) when it starts and removed when it stops; its namespace goes
with it. Nothing of the host's kernel RDMA is used: this machine's kernel has none.
"""

from __future__ import annotations

import contextlib
import logging
import re
import shlex
import subprocess
import time
from pathlib import Path
from typing import Any

from vrdma.container_files import write_tree
from vrdma.daemon.admin import ask
from vrdma.errors import VrdmaError
from vrdma.harness import verbs
from vrdma.harness.hosts import Host
from vrdma.harness.multihost import GUEST_BRIDGE, ROCE_TABLE, roce_rule, run_on
from vrdma.harness.process import Managed
from vrdma.harness.vm import Vm

log = logging.getLogger(__name__)

SOCKET_DIR = "/run/vrdma"  # where a container sees its device's socket
PORT = 18515  # the TCP port ibv_*_pingpong and perftest exchange their QP numbers on


class ContainerError(VrdmaError):
    """A container could not be made or a command in it could not run."""


def root_filesystem() -> Path:
    """The guest image's root filesystem, unpacked (once per image) for containers to run from."""
    from vrdma.buildchain.cache import CachedProduct, step
    from vrdma.buildchain.image import COMPCHAN_LIBRARY
    from vrdma.buildchain.kernel import kernel_product

    image = kernel_product("image", None)
    if "rootfs_path" not in image:
        raise ContainerError("the image product names no root filesystem: run `make image`")
    preload = f"/usr/lib/x86_64-linux-gnu/{COMPCHAN_LIBRARY}"
    cached = CachedProduct("container-root", {"rootfs": image["rootfs_key"], "preload": preload})
    if not cached.complete:
        with cached.building() as scratch, step("unpacking the guest root filesystem for containers"):
            (scratch / "root").mkdir()
            with open(image["rootfs_path"], "rb") as archive:
                subprocess.run(["cpio", "-idm", "--quiet"], stdin=archive, cwd=scratch / "root", check=True)
            # What a container's image adds to a guest's: completion channels for its devices (compchan.c).
            (scratch / "root" / "etc" / "ld.so.preload").write_text(preload + "\n")
    return cached.path / "root"


class Container(Managed):
    """``with Container(name, host, address, admin_socket, directory) as c: c.run([...])``: container ``name`` on
    ``host`` (its guest bridge; ``gateway`` its address there), served by the backend at ``admin_socket``."""

    def __init__(self, name: str, host: Host, address: str, gateway: str, admin_socket: Path, directory: Path,
                 root: Path | None = None, qos: dict[str, Any] | None = None, prefixlen: int = 24) -> None:
        self.name = name
        self.host = host
        self.address = address
        self.gateway = gateway
        self.prefixlen = prefixlen
        self.admin_socket = admin_socket
        self.directory = directory / name
        self.root = root
        self.qos = qos
        self.device = f"vrdma-{name}"
        self.netns = f"{host.netns}-{name}"
        self.veth = f"vc-{name}"[:15]
        self.socket = self.directory / "device.sock"
        self.added = False

    # -- lifecycle ------------------------------------------------------------------------------------------------

    def start(self) -> None:
        if self.root is None:
            self.root = root_filesystem()
        self.directory.mkdir(parents=True, exist_ok=True)
        write_tree(self.directory / "sys", self.device, self.address, f"{SOCKET_DIR}/{self.device}.sock")
        subprocess.run(["ip", "netns", "add", self.netns], check=True, capture_output=True)
        run_on(self.host, [["ip", "link", "add", self.veth, "type", "veth", "peer", "name", "eth0", "netns",
                            self.netns],
                           ["ip", "link", "set", self.veth, "master", GUEST_BRIDGE, "up"],
                           ["bridge", "link", "set", "dev", self.veth, "isolated", "on"],
                           # RoCE for the container's address goes to the host's backend (as a vrdma guest's)
                           ["ip", "route", "replace", "local", "0.0.0.0/0", "dev", "lo", "table", str(ROCE_TABLE)],
                           roce_rule("add", self.address)])
        for argv in (["ip", "addr", "add", f"{self.address}/{self.prefixlen}", "dev", "eth0"],
                     ["ip", "link", "set", "eth0", "up"], ["ip", "link", "set", "lo", "up"],
                     ["ip", "route", "add", "default", "via", self.gateway]):
            self._in_netns(argv)
        request: dict[str, Any] = {"command": "container-add", "name": self.name, "socket-path": str(self.socket),
                                   "address": self.address}
        if self.qos:
            request["qos"] = self.qos
        reply = ask(self.admin_socket, request)
        if not reply.get("ok"):
            raise ContainerError(f"{self.name}: the backend refused it: {reply.get('error')}")
        self.added = True
        log.info("%s: container on %s at %s, device %s", self.name, self.host.name, self.address, self.device)

    def stop(self) -> None:
        if self.added:
            with contextlib.suppress(OSError):
                ask(self.admin_socket, {"command": "container-remove", "name": self.name})
            self.added = False
        with contextlib.suppress(Exception):
            run_on(self.host, [roce_rule("del", self.address)])
        subprocess.run(["ip", "netns", "del", self.netns], check=False, capture_output=True)

    def _in_netns(self, argv: list[str]) -> None:
        result = subprocess.run(["ip", "netns", "exec", self.netns, *argv], capture_output=True, text=True,
                                check=False)
        if result.returncode:
            raise ContainerError(f"{self.name}: {' '.join(argv)} failed: {result.stderr.strip()}")

    # -- commands -------------------------------------------------------------------------------------------------

    def command(self, argv: list[str]) -> list[str]:
        """``argv`` as it runs in the container (fresh mount and PID namespaces, its root, its device's files)."""
        root = shlex.quote(str(self.root))
        sock = f"{root}{SOCKET_DIR}/{self.device}.sock"
        setup = "\n".join([
            "set -e",
            f"mount --bind {shlex.quote(str(self.directory / 'sys'))} {root}/sys",
            f"mount -t tmpfs vrdma-run {root}/run",
            f"mkdir -p {root}{SOCKET_DIR}",
            f"touch {sock}",
            f"mount --bind {shlex.quote(str(self.socket))} {sock}",
            f"mount -t tmpfs vrdma-tmp {root}/tmp",
            f"mount -t tmpfs -o mode=755 vrdma-dev {root}/dev",
            f"mkdir -p {root}/dev/infiniband {root}/dev/shm",
            f"touch {root}/dev/infiniband/uverbs0 {root}/dev/null {root}/dev/zero {root}/dev/urandom",
            f"mount --bind /dev/null {root}/dev/infiniband/uverbs0",
            f"for d in null zero urandom; do mount --bind /dev/$d {root}/dev/$d; done",
            f"mount -t proc proc {root}/proc",
            f'exec chroot {root} "$@"',
        ])
        return ["ip", "netns", "exec", self.netns, "unshare", "--mount", "--pid", "--fork", "--kill-child",
                "sh", "-c", setup, "container", *argv]

    def run(self, argv: list[str], timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        """Run a command in the container to its end (TimeoutExpired past ``timeout``)."""
        return subprocess.run(self.command(argv), capture_output=True, text=True, timeout=timeout, check=False)

    def popen(self, argv: list[str]) -> subprocess.Popen[str]:
        return subprocess.Popen(self.command(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def describe(self) -> dict[str, Any]:
        """The backend's description of this container (its processes, their regions and objects)."""
        reply = ask(self.admin_socket, {"command": "container-list"})
        found = [c for c in reply.get("containers", []) if c["name"] == self.name]
        if not found:
            raise ContainerError(f"{self.name}: the backend does not serve it: {reply}")
        return found[0]  # type: ignore[no-any-return]


# -- programs between containers and VMs ----------------------------------------------------------------------------

Side = Container | Vm


def device_of(side: Side) -> str:
    return side.device if isinstance(side, Container) else "vrdma0"


def gid_index_of(side: Side) -> int:
    """A container's GID is at index 0 (its device's files); a guest's IPv4 GID wherever its kernel put it."""
    return 0 if isinstance(side, Container) else verbs.ipv4_gid_index(side, "vrdma0")


def run_in(side: Side, argv: list[str], timeout: float = 180.0) -> tuple[int, str]:
    """Run a command in a container or a guest to its end: exit status and output."""
    if isinstance(side, Container):
        done = side.run(argv, timeout=timeout)
        return done.returncode, done.stdout + done.stderr
    result = side.run(argv, timeout=timeout)
    return result.exit_status, result.stdout + result.stderr


def _listening(side: Container) -> bool:
    out = subprocess.run(["ip", "netns", "exec", side.netns, "ss", "-ltnH"], capture_output=True, text=True,
                         check=False).stdout
    return re.search(rf":{PORT}\s", out) is not None


def client_server(server: Side, client: Side, tool: str, *args: str, timeout: float = 240.0) -> str:
    """A verbs program (ibv_*_pingpong, perftest) as server in one side and client in the other, each on its own
    device and IPv4 GID; the client's output. ContainerError with both outputs when either side fails."""
    gid = "-x" if tool.startswith("ib_") else "-g"
    server_argv = [tool, "-d", device_of(server), gid, str(gid_index_of(server)), *args]
    client_argv = [tool, "-d", device_of(client), gid, str(gid_index_of(client)), *args, server.address]
    if isinstance(server, Container):
        proc = server.popen(server_argv)
        try:
            deadline = time.monotonic() + 60
            while not _listening(server) and proc.poll() is None:
                if time.monotonic() > deadline:
                    raise ContainerError(f"{tool} does not listen in {server.name} after 60 s")
                time.sleep(0.05)  # polling another process's socket table, not waiting for a guess
            status, out = run_in(client, client_argv, timeout)
            server_out, server_err = proc.communicate(timeout=timeout)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        server_status, server_text = proc.returncode, server_out + server_err
    else:
        pid = server.agent.spawn(server_argv)
        verbs.wait_listening(server, PORT, server_pid=pid)
        status, out = run_in(client, client_argv, timeout)
        result = server.agent.wait(pid, server_argv, timeout)
        server_status, server_text = result.exit_status, result.stdout + result.stderr
    if status or server_status:
        raise ContainerError(f"{tool}: server {server.name} exit {server_status}, client {client.name} exit "
                             f"{status}\nserver:\n{server_text}\nclient:\n{out}")
    return out
