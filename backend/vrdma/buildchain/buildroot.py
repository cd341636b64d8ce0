"""Build roots: a chroot of one Debian release, made with mmdebstrap, in which a build runs with that release's
own compiler, libraries and packaging tools (a kernel's modules, a release's .deb packages).

A build never writes into a build root: the tree it builds is bind-mounted at ``MOUNT`` in a mount namespace of
its own (``unshare --mount``: nothing shows on the host), with /proc mounted there too (objtool and dpkg read it).
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path

from vrdma.buildchain.apt import PrivateArchive
from vrdma.buildchain.cache import run

# Where a build root sees the tree being built.
MOUNT = "/mnt/vrdma-build"


def make(archive: PrivateArchive, packages: Sequence[str], dest: Path, log_file: Path) -> None:
    """A build root of ``archive``'s suite at ``dest``: its essential packages and ``packages`` (``name`` or
    ``name=version``), installed by apt in a chroot (maintainer scripts run natively: same architecture)."""
    run(["mmdebstrap", "--variant=essential", "--include=" + ",".join(packages), archive.suite, dest,
         archive.binary_sources], log_file=log_file)
    (dest / MOUNT.lstrip("/")).mkdir(parents=True)


def run_in(build_root: Path, tree: Path, argv: Sequence[str], log_file: Path, *, cwd: str = ".",
           env: Mapping[str, str] | None = None) -> None:
    """Run ``argv`` in ``build_root`` with ``tree`` at ``MOUNT``, from ``MOUNT/cwd``, with a clean environment
    (PATH, HOME, LC_ALL=C.UTF-8, SOURCE_DATE_EPOCH when set, and ``env``)."""
    variables = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root", "LC_ALL": "C.UTF-8"}
    if "SOURCE_DATE_EPOCH" in os.environ:
        variables["SOURCE_DATE_EPOCH"] = os.environ["SOURCE_DATE_EPOCH"]
    variables.update(env or {})
    command = shlex.join(["env", "-i", *(f"{k}={v}" for k, v in variables.items()), *argv])
    script = (f'mount -t proc proc "$1/proc" && mount --bind "$2" "$1{MOUNT}" && '
              f'exec chroot "$1" sh -c "cd {shlex.quote(f"{MOUNT}/{cwd}")} && exec $3"')
    run(["unshare", "--mount", "--propagation", "private", "--fork", "sh", "-c", script, "build-root", build_root,
         tree, command], log_file=log_file)
