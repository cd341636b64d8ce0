"""Choosing the accelerator: KVM where it can boot a Linux guest, TCG otherwise, said in one log line.

``/dev/kvm`` existing is not enough: on some hosts (nested virtualisation without the needed support) KVM runs
real-mode firmware but a Linux kernel hangs as soon as it enters long mode. The probe therefore boots the real
guest kernel under KVM without a root filesystem and waits a few seconds for it to print its banner and then
panic for want of a root. The answer is cached per host boot (``/proc/sys/kernel/random/boot_id``) and per
QEMU and kernel, so only the first guest after a reboot pays for it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import selectors
import subprocess
import time
from pathlib import Path

from vrdma import paths

log = logging.getLogger(__name__)

PROBE_DEADLINE = 6.0   # a working KVM reaches the panic in about one second
KVM_DEVICE = Path("/dev/kvm")
BANNER = b"Linux version"
NO_ROOT_PANIC = b"Kernel panic"


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return "unknown"


def probe_kvm(qemu_binary: str, firmware_dirs: list[str], kernel: str) -> tuple[bool, str]:
    """Return (usable, reason): can this host boot our guest kernel under KVM?"""
    if not KVM_DEVICE.exists():
        return False, f"{KVM_DEVICE} does not exist"
    if not os.access(KVM_DEVICE, os.R_OK | os.W_OK):
        return False, f"{KVM_DEVICE} is not accessible to this user"
    argv = [qemu_binary, *(a for d in firmware_dirs for a in ("-L", d)), "-nodefaults", "-no-user-config",
            "-machine", "q35,accel=kvm", "-cpu", "host", "-m", "256", "-display", "none", "-no-reboot",
            "-serial", "stdio", "-kernel", kernel, "-append", "console=ttyS0 earlyprintk=ttyS0 panic=-1"]
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert proc.stdout is not None
    output = b""
    deadline = time.monotonic() + PROBE_DEADLINE
    try:
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)
            while NO_ROOT_PANIC not in output and (remaining := deadline - time.monotonic()) > 0:
                if not sel.select(remaining):
                    continue
                chunk = os.read(proc.stdout.fileno(), 65536)
                if not chunk:
                    break
                output += chunk
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
    if NO_ROOT_PANIC in output:
        return True, "KVM booted the guest kernel"
    if BANNER in output:
        return False, "the guest kernel started under KVM but did not finish its early boot"
    last = output.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
    return False, f"the guest kernel did not start under KVM within {PROBE_DEADLINE:g} s (last output: {last[0]})"


def choose(requested: str, qemu_binary: str, firmware_dirs: list[str], kernel: str) -> str:
    """Resolve ``auto`` to ``kvm`` or ``tcg`` and log the choice once; explicit choices are honoured."""
    if requested in ("kvm", "tcg"):
        log.info("accelerator: %s (requested)", requested)
        return requested
    cache_file = paths.cache_dir() / "accel-probe.json"
    key = {"boot_id": _boot_id(), "qemu": qemu_binary, "kernel": kernel}
    cached = None
    with contextlib.suppress(OSError, ValueError):
        cached = json.loads(cache_file.read_text())
    if isinstance(cached, dict) and cached.get("key") == key:
        usable, reason = bool(cached["usable"]), str(cached["reason"])
    else:
        usable, reason = probe_kvm(qemu_binary, firmware_dirs, kernel)
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        cache_file.write_text(json.dumps({"key": key, "usable": usable, "reason": reason}))
    if usable:
        log.info("accelerator: KVM (%s)", reason)
        return "kvm"
    log.info("accelerator: TCG, because KVM cannot boot a guest here: %s", reason)
    return "tcg"
