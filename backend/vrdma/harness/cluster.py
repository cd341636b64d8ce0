"""Several guests on one private link, started together and stopped together."""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import subprocess
from pathlib import Path
from typing import Any

from vrdma.errors import VrdmaError
from vrdma.harness import accel as accel_probe
from vrdma.harness import daemon, linkhub
from vrdma.harness.daemon import DaemonProcess
from vrdma.harness.process import Managed
from vrdma.harness.qemu_cmdline import GuestIdentity
from vrdma.harness.vm import Products, Vm, guest_of, migration_directory

log = logging.getLogger(__name__)


class Cluster(Managed):
    """``with Cluster(2, directory) as guests:`` boots vm0, vm1, ... on one link and waits until all are ready."""

    def __init__(self, count: int, directory: Path, *, accel: str = "auto", memory_mib: int = 1024,
                 boot_timeout: float = 120.0, detach: bool = False, products: Products | None = None,
                 append_extra: dict[int, str] | None = None, with_device: bool = True,
                 test_hooks: bool = False, device: str = "rdma", cpus: int = 1) -> None:
        """``device``: how QEMU gives each guest its vrdma device (qemu_cmdline.DEVICE_TEMPLATES); ``cpus``: each
        guest's vCPUs."""
        if count < 1:
            raise ValueError(f"a cluster needs at least one guest, not {count}")
        self.count = count
        self.directory = directory
        self.requested_accel = accel
        self.memory_mib = memory_mib
        self.cpus = cpus
        self.boot_timeout = boot_timeout
        self.detach = detach
        self.products = products
        self.append_extra = append_extra or {}
        self.with_device = with_device
        self.test_hooks = test_hooks
        self.device = device
        self.vms: list[Vm] = []
        self.hub: subprocess.Popen[bytes] | None = None
        self.backend: DaemonProcess | None = None
        self.accel = ""

    def __getitem__(self, key: int | str) -> Vm:
        return guest_of(self.vms, key)

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self.vms)

    def link_paths(self, index: int) -> str:
        """Where guest ``index`` sends its frames: the other guest's socket, or the hub's."""
        if self.count == 2:
            return str(self.directory / f"vm{1 - index}" / "link.sock")
        return str(self.directory / "hub.sock")

    def start(self) -> None:
        products = self.products or Products.load()
        self.directory.mkdir(parents=True, exist_ok=True)
        self.accel = accel_probe.choose(self.requested_accel, str(products.qemu["binary_path"]),
                                        list(products.qemu["firmware_dirs"]), str(products.kernel["vmlinuz_path"]))
        identities = [GuestIdentity(i) for i in range(self.count)]
        if self.with_device:
            # One backend for all guests, listening before any QEMU starts.
            self.backend = daemon.for_guests(self.directory, identities, detach=self.detach,
                                             test_hooks=self.test_hooks)
            self.backend.start()
        if self.count > 2:
            guests = [self.directory / ident.name / "link.sock" for ident in identities]
            self.hub = linkhub.start(self.directory / "hub.sock", guests, self.directory / "hub.log", self.detach)
        for ident in identities:
            self.vms.append(Vm(ident, self.directory / ident.name, accel=self.accel, products=products,
                               link_remote=self.link_paths(ident.index), memory_mib=self.memory_mib,
                               boot_timeout=self.boot_timeout, detach=self.detach,
                               append_extra=self.append_extra.get(ident.index, ""),
                               with_device=self.with_device, device=self.device, cpus=self.cpus))
        for vm in self.vms:
            vm.launch()  # from this thread: QEMU's parent-death signal follows the launching thread
        with concurrent.futures.ThreadPoolExecutor(len(self.vms)) as pool:
            futures = [pool.submit(vm.wait_ready) for vm in self.vms]
            errors = [f.exception() for f in futures]
        first = next((e for e in errors if e is not None), None)
        if first is not None:
            raise first

    def add(self, index: int, device: str | None = None) -> Vm:
        """Boot one more guest while the others run: the running backend is asked to serve its device first
        (vm-add, as an operator's hook does before QEMU starts), then its QEMU starts. It has a network link of its
        own that reaches no other guest (the cluster's links were made at start). ``device``: how QEMU gives it its
        vrdma device (default: as the cluster's guests)."""
        if self.backend is None:
            raise ValueError("guests are added to a cluster with the vrdma device (and so a backend)")
        products = self.products or Products.load()
        ident = GuestIdentity(index)
        if any(vm.name == ident.name for vm in self.vms):
            raise ValueError(f"{ident.name} is already in the cluster")
        directory = self.directory / ident.name
        directory.mkdir(parents=True, exist_ok=True)
        reply = daemon.admin(self.backend, {"command": "vm-add", "name": ident.name, "mac": ident.mac,
                                            "socket-path": str(daemon.socket_path(self.directory, ident))})
        if not reply.get("ok"):
            raise VrdmaError(f"the backend refused to serve {ident.name}: {reply.get('error')}")
        vm = Vm(ident, directory, accel=self.accel, products=products,
                link_remote=str(directory / "unlinked.sock"), memory_mib=self.memory_mib,
                boot_timeout=self.boot_timeout, detach=self.detach, device=device or self.device)
        self.vms.append(vm)
        vm.launch()
        vm.wait_ready()
        return vm

    def migrate(self, name: str, **options: Any) -> dict[str, Any]:
        """Live-migrate guest ``name`` to a new QEMU served by the same backend (Vm.migrate_to; ``options``: its
        own), in a directory of its own (NAME.m1, NAME.m2, ...: the source's logs stay); the new QEMU is the
        cluster's guest afterwards. Returns query-migrate's last answer."""
        vm = self[name]
        destination = vm.incoming_copy(migration_directory(self.directory, name))
        info = vm.migrate_to(destination, **options)
        self.vms[self.vms.index(vm)] = destination
        return info

    def remove(self, name: str, *, shut_down_first: bool = True) -> None:
        """Stop serving a guest's device (vm-remove) and stop the guest; ``shut_down_first`` False: the device is
        removed while its QEMU is still connected (its driver sees the backend go), then the guest is stopped."""
        vm = self[name]
        if self.backend is None:
            raise ValueError("this cluster has no backend")
        if shut_down_first:
            vm.shutdown()
        reply = daemon.admin(self.backend, {"command": "vm-remove", "name": name})
        if not reply.get("ok"):
            raise VrdmaError(f"the backend refused to remove {name}: {reply.get('error')}")
        if not shut_down_first:
            vm.shutdown()
        self.vms.remove(vm)

    def stop(self) -> None:
        for vm in self.vms:
            with contextlib.suppress(Exception):
                vm.shutdown()
        if self.backend is not None:
            self.backend.stop()
            self.backend = None
        if self.hub is not None:
            self.hub.terminate()
            try:
                self.hub.wait(10)
            except subprocess.TimeoutExpired:
                self.hub.kill()
                self.hub.wait()
            self.hub = None
