"""Content-keyed build cache, the product registry and progress reporting for long steps.

A product lives in ``<cache>/<kind>/<key>/``, where the key hashes every input that shapes it (package
versions, patch and script contents, configure flags). It is built in a temporary sibling directory and renamed
into place only when complete, so an interrupted build never looks finished. ``build/products.json`` in the
checkout records which product of each kind this checkout uses; the harness reads only that.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import shutil
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from vrdma import paths
from vrdma.errors import BuildError, MissingProductError

log = logging.getLogger(__name__)


def content_key(inputs: Mapping[str, Any]) -> str:
    """A short stable hash of a JSON-serialisable mapping of inputs."""
    blob = json.dumps(inputs, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@contextlib.contextmanager
def step(name: str) -> Iterator[None]:
    """Log the start and the duration of a long step."""
    log.info("%s ...", name)
    start = time.monotonic()
    try:
        yield
    except BaseException:
        log.error("%s failed after %.1f s", name, time.monotonic() - start)
        raise
    log.info("%s done in %.1f s", name, time.monotonic() - start)


def run(cmd: Sequence[str | os.PathLike[str]], *, log_file: Path | None = None,
        cwd: Path | None = None, env: Mapping[str, str] | None = None) -> None:
    """Run a build command; on failure raise BuildError with the command and the tail of its output."""
    argv = [str(a) for a in cmd]
    log.debug("running %s", " ".join(argv))
    merged_env = {**os.environ, **(env or {})}
    if log_file is None:
        captured = subprocess.run(argv, cwd=cwd, env=merged_env, capture_output=True, text=True, check=False)
        status, output = captured.returncode, captured.stdout + captured.stderr
    else:
        log_file.parent.mkdir(parents=True, exist_ok=True)
        with log_file.open("ab") as out:
            status = subprocess.run(argv, cwd=cwd, env=merged_env, stdout=out, stderr=subprocess.STDOUT,
                                    check=False).returncode
        output = log_file.read_text(errors="replace")
    if status != 0:
        tail = "\n".join(output.splitlines()[-25:])
        where = f" (full log: {log_file})" if log_file else ""
        raise BuildError(f"command failed with exit status {status}{where}: {' '.join(argv)}\n{tail}")


def capture(cmd: Sequence[str | os.PathLike[str]], *, env: Mapping[str, str] | None = None) -> str:
    """Run a query command and return its stdout; BuildError on failure."""
    argv = [str(a) for a in cmd]
    proc = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, **(env or {})}, check=False)
    if proc.returncode != 0:
        raise BuildError(f"command failed with exit status {proc.returncode}: {' '.join(argv)}\n"
                         f"{proc.stderr.strip()}")
    return proc.stdout


class CachedProduct:
    """One product directory in the cache, keyed by its inputs."""

    def __init__(self, kind: str, inputs: Mapping[str, Any]) -> None:
        self.kind = kind
        self.inputs = dict(inputs)
        self.key = content_key(self.inputs)
        self.path = paths.cache_dir() / kind / self.key
        self._marker = self.path / ".complete.json"

    @property
    def complete(self) -> bool:
        return self._marker.is_file()

    @contextlib.contextmanager
    def building(self) -> Iterator[Path]:
        """Yield a scratch directory; on success it becomes the product directory atomically."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        scratch = self.path.parent / f".{self.key}.partial-{os.getpid()}"
        shutil.rmtree(scratch, ignore_errors=True)
        scratch.mkdir()
        try:
            yield scratch
        except BaseException:
            log.error("keeping the partial %s build for inspection: %s", self.kind, scratch)
            raise
        (scratch / ".complete.json").write_text(json.dumps(self.inputs, indent=2, sort_keys=True))
        shutil.rmtree(self.path, ignore_errors=True)
        scratch.rename(self.path)


@contextlib.contextmanager
def _locked_products() -> Iterator[dict[str, Any]]:
    path = paths.products_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        data: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
        yield data
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
        tmp.rename(path)


def record_product(kind: str, info: Mapping[str, Any]) -> None:
    """Record that this checkout uses the given product (paths in ``info`` are absolute strings)."""
    with _locked_products() as data:
        data[kind] = dict(info)


def product(kind: str) -> dict[str, Any]:
    """The recorded product of a kind, checked to still exist on disk."""
    path = paths.products_file()
    data: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    info = data.get(kind)
    if info is None:
        raise MissingProductError(kind, f"it is not recorded in {path}")
    for name, value in info.items():
        if name.endswith(("_path", "_dir")) and not Path(value).exists():
            raise MissingProductError(kind, f"{name} {value} does not exist")
    return dict(info)
