"""libvirtd for tests, as a context manager: the system daemon of the host's libvirt packages, run so that it
touches nothing of the host's.

It runs in a private mount namespace (``unshare --mount``) in which its configuration, state, cache and log
directories (/etc/libvirt, /run/libvirt, /var/lib/libvirt, /var/cache/libvirt, /var/log/libvirt) are bind mounts
of directories under the test's own, so its socket is reachable from the host (virsh ``?socket=``) and everything
it writes stays there. qemu.conf runs QEMU as root without sandboxing: the test host has no libvirt users,
cgroup delegation or security drivers, and libvirt resolves its compiled-in QEMU user (``libvirt-qemu``) before it
reads qemu.conf, so /etc/passwd and /etc/group in the namespace are copies with that user added.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from types import TracebackType
from typing import Any

from vrdma.errors import VrdmaError

log = logging.getLogger(__name__)

DIRECTORIES = {"etc": "/etc/libvirt", "run": "/run/libvirt", "lib": "/var/lib/libvirt",
               "cache": "/var/cache/libvirt", "log": "/var/log/libvirt"}
QEMU_CONF = """\
# Written by vrdma.harness.libvirt: QEMU as root, no sandboxing (a test host, nothing else on it).
user = "root"
group = "root"
swtpm_user = "root"
swtpm_group = "root"
dynamic_ownership = 0
security_driver = "none"
namespaces = [ ]
cgroup_controllers = [ ]
# QEMU's output straight to /var/log/libvirt/qemu/<domain>.log: no virtlogd to run beside libvirtd.
stdio_handler = "file"
"""
LIBVIRTD_CONF = 'unix_sock_group = "root"\nauth_unix_rw = "none"\n'
START_TIMEOUT = 60.0


class LibvirtError(VrdmaError):
    pass


class Libvirtd:
    """``with Libvirtd(directory, hook=SCRIPT) as libvirtd: libvirtd.virsh("start", ...)``. ``hook``: the text of
    /etc/libvirt/hooks/qemu (libvirt runs it around each QEMU's life)."""

    def __init__(self, directory: Path, hook: str | None = None) -> None:
        self.directory = directory
        self.hook = hook
        self.socket = directory / "run" / "libvirt-sock"
        self.log = directory / "libvirtd.log"
        self._process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Libvirtd:
        if shutil.which("libvirtd") is None:
            raise LibvirtError("libvirtd is not installed: `make deps` installs libvirt-daemon")
        for name in DIRECTORIES:
            (self.directory / name).mkdir(parents=True, exist_ok=True)
        etc = self.directory / "etc"
        (etc / "qemu.conf").write_text(QEMU_CONF)
        (etc / "libvirtd.conf").write_text(LIBVIRTD_CONF)
        if self.hook is not None:
            (etc / "hooks").mkdir(exist_ok=True)
            (etc / "hooks" / "qemu").write_text(self.hook)
            (etc / "hooks" / "qemu").chmod(0o755)
        for sub in ("lib/qemu", "log/qemu"):
            (self.directory / sub).mkdir(parents=True, exist_ok=True)
        accounts = self.directory / "accounts"
        accounts.mkdir(exist_ok=True)
        (accounts / "passwd").write_text(Path("/etc/passwd").read_text() +
                                         "libvirt-qemu:x:64055:64055::/var/lib/libvirt:/usr/sbin/nologin\n")
        group = Path("/etc/group").read_text()
        (accounts / "group").write_text(group + "libvirt-qemu:x:64055:\n" +
                                        ("" if "\nkvm:" in "\n" + group else "kvm:x:64056:\n"))
        # (A mount point missing on the host, /run/libvirt where no libvirtd ever ran, is made empty.)
        mounts = [f'mkdir -p "{target}" && mount --bind "{self.directory / name}" "{target}"'
                  for name, target in DIRECTORIES.items()]
        mounts += [f'mount --bind "{accounts / name}" /etc/{name}' for name in ("passwd", "group")]
        script = " && ".join([*mounts, "exec libvirtd -f /etc/libvirt/libvirtd.conf -p /run/libvirt/libvirtd.pid"])
        with self.log.open("wb") as out:
            self._process = subprocess.Popen(
                ["unshare", "--mount", "--propagation", "private", "--fork", "sh", "-c", script],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LIBVIRT_LOG_OUTPUTS": "3:stderr"})
        deadline = time.monotonic() + START_TIMEOUT
        # libvirtd has no readiness notification without systemd: its socket answering is the event.
        while not self.socket.exists() or self.virsh("list", check=False).returncode != 0:
            if self._process.poll() is not None:
                raise LibvirtError(f"libvirtd exited ({self._process.returncode}):\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise LibvirtError(f"libvirtd did not answer within {START_TIMEOUT:g} s:\n{self.log_tail()}")
            time.sleep(0.2)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._process is not None and self._process.poll() is None:
            for name in self.domains():
                self.virsh("destroy", name, check=False)
            # libvirtd is unshare's child, in the session started for it: signal them both.
            os.killpg(self._process.pid, signal.SIGTERM)
            try:
                self._process.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self._process.pid, signal.SIGKILL)
                self._process.wait()
        if exc is not None:
            log.error("libvirtd's log (%s):\n%s", self.log, self.log_tail())

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def virsh(self, *args: str, check: bool = True, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        """virsh against this libvirtd."""
        proc = subprocess.run(["virsh", "-c", f"qemu:///system?socket={self.socket}", *args], input=stdin,
                              capture_output=True, text=True, check=False, timeout=120)
        if check and proc.returncode != 0:
            raise LibvirtError(f"virsh {' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}\n"
                               f"libvirtd's log:\n{self.log_tail()}")
        return proc

    def domains(self) -> list[str]:
        listed = self.virsh("list", "--name", check=False).stdout
        return [name for name in listed.split() if name]

    def agent(self, domain: str, command: str, arguments: dict[str, Any] | None = None) -> Any:
        """A guest agent command through libvirt (virsh qemu-agent-command); its "return" value."""
        request = json.dumps({"execute": command, **({"arguments": arguments} if arguments else {})})
        reply = json.loads(self.virsh("qemu-agent-command", domain, request, "--timeout", "60").stdout)
        return reply["return"]
