"""The backend's C with AddressSanitizer and UndefinedBehaviorSanitizer: a separate build, and a backend that loads it.

``build()`` compiles the three cffi modules of the backend (the data engine, the libvhost-user binding with its
glue, the fault guard) with ``-fsanitize=address,undefined`` into build/sanitize/, next to nothing the normal
build uses (`make backend` keeps making the in-place modules). It compiles with the compiler of the normal
build (gcc, through cffi and setuptools), so the runtime to preload is gcc's libasan.

CPython itself is not instrumented, so ASan's runtime must be the first library of the process: the backend runs
with LD_PRELOAD of libasan (``environment()``), and through ``python -m fuzz.sanitize run ARGS...``, which puts
the sanitized modules in place of the normal ones (an import hook: ``vrdma.engine._engine`` and the others load
from build/sanitize/) and then runs ``vrdma ARGS...``. The options, and why:

- ``detect_leaks=0``: CPython's own allocations at exit are not ours to report;
- ``halt_on_error=1`` (ASan and UBSan): the first report ends the process, so no report goes unnoticed;
- ``handle_sigbus=0``: the backend's fault guard (vrdma.faultguard) handles SIGBUS in guest memory a VM can
  truncate; with ASan's own handler installed first, ASan would swallow the guard's sigaction and report the
  contained fault as a crash;
- ``print_stacktrace=1`` for UBSan, whose reports otherwise carry no stack;
- ``quarantine_size_mb=0`` where the caller asks for it (the backend-process tests bound RSS growth: see
  ``environment``); elsewhere ASan's default quarantine of 256 MiB.

``report_in(text)`` finds a sanitizer report in a log: tests/backend_process.py fails a test whose backend wrote
one (VRDMA_SANITIZE=1 makes it start the backend this way).

``python -m fuzz.sanitize build`` builds; ``python -m fuzz.sanitize env`` prints the environment.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from vrdma._cffi_inplace import DEVICE_API_HEADERS

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "backend" / "vrdma"
OUT = ROOT / "build" / "sanitize"
MANIFEST = OUT / "modules.json"
SANITIZE = "-fsanitize=address,undefined"
# VRE_CHECK_INVARIANTS: the data engine aborts, naming it, when its RoCE state breaks an invariant (net.c).
CFLAGS = f"{SANITIZE} -fno-omit-frame-pointer -g -DVRE_CHECK_INVARIANTS"
BUILDS = {  # module -> its cffi recipe (each defines make_ffi())
    "vrdma.engine._engine": PACKAGE / "engine" / "_build.py",
    "vrdma.faultguard._faultguard": PACKAGE / "faultguard" / "_build.py",
    "vrdma.vhost_user._libvhost_user": PACKAGE / "vhost_user" / "_build.py",
}
ASAN_OPTIONS = "detect_leaks=0:halt_on_error=1:handle_sigbus=0:abort_on_error=0:allocator_may_return_null=1"
UBSAN_OPTIONS = "halt_on_error=1:print_stacktrace=1"
REPORT = re.compile(r"ERROR: (AddressSanitizer|LeakSanitizer)|SUMMARY: (AddressSanitizer|UndefinedBehaviorSanitizer)"
                    r"|^\S+:\d+:\d+: runtime error: |AddressSanitizer:DEADLYSIGNAL|vrdma engine: invariant broken",
                    re.M)
LOADED_NOTE = "sanitizer build: loaded"


class SanitizeError(Exception):
    pass


def asan_runtime() -> str:
    """gcc's libasan (the normal build's compiler; the sanitized modules link against it)."""
    path = subprocess.run(["gcc", "-print-file-name=libasan.so"], check=True, capture_output=True,
                          text=True).stdout.strip()
    if not os.path.isabs(path) or not os.path.exists(path):
        raise SanitizeError(f"gcc has no libasan ({path!r}): install libgcc-12-dev")
    return os.path.realpath(path)


def _recipe(module: str) -> ModuleType:
    """A module's _build.py, loaded as a plain file (importing its package would load the module being built)."""
    spec = importlib.util.spec_from_file_location(f"_sanitize_build_{module.replace('.', '_')}", BUILDS[module])
    assert spec is not None and spec.loader is not None
    recipe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(recipe)
    return recipe


def _inputs(module: str, recipe: ModuleType) -> list[Path]:
    here = BUILDS[module].parent
    files = [*sorted(p for p in here.iterdir() if p.suffix in (".c", ".h")), BUILDS[module], Path(__file__),
             PACKAGE / "_cffi_inplace.py"]
    if module == "vrdma.engine._engine":
        files += [ROOT / "guest-driver" / "include" / name for name in DEVICE_API_HEADERS]
    if module == "vrdma.vhost_user._libvhost_user":
        lvu = recipe.libvhost_user_dir()
        files += [lvu / "libvhost-user.c", lvu / "libvhost-user.h"]
    return files


def build(verbose: bool = False) -> dict[str, str]:
    """Compile what changed; return {module: path of its sanitized .so}."""
    sys.path.insert(0, str(PACKAGE.parent))
    manifest = json.loads(MANIFEST.read_text()) if MANIFEST.exists() else {}
    modules: dict[str, str] = {}
    for module in BUILDS:
        recipe = _recipe(module)
        digest = hashlib.sha256(CFLAGS.encode())
        for path in _inputs(module, recipe):
            digest.update(path.read_bytes())
        key = digest.hexdigest()[:16]
        entry = manifest.get(module, {})
        if entry.get("key") == key and Path(entry.get("path", "")).exists():
            modules[module] = entry["path"]
            continue
        ffi = recipe.make_ffi()
        tmpdir = OUT / "cffi" / module
        tmpdir.mkdir(parents=True, exist_ok=True)
        saved = {name: os.environ.get(name) for name in ("CFLAGS", "LDFLAGS")}
        # setuptools appends $CFLAGS to every compile and $CFLAGS and $LDFLAGS to the link of the extension.
        os.environ["CFLAGS"] = CFLAGS
        os.environ["LDFLAGS"] = SANITIZE
        try:
            built = ffi.compile(tmpdir=str(tmpdir), verbose=verbose)
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
        manifest[module] = {"key": key, "path": str(built)}
        modules[module] = str(built)
        print(f"sanitizer build: built {module} ({built})")
    MANIFEST.parent.mkdir(parents=True, exist_ok=True)
    MANIFEST.write_text(json.dumps(manifest, indent=1))
    return modules


def environment(base: dict[str, str] | None = None, quarantine_mb: int | None = None) -> dict[str, str]:
    """The environment of a sanitized backend (see the module's docstring for the options).

    ``quarantine_mb``: how much freed memory ASan keeps poisoned before reusing it (its default: 256 MiB). A test
    that bounds the backend's RSS growth needs 0: ASan's quarantine would be the growth it measures. Freed memory
    stays poisoned until it is handed out again, so a use after free is still caught unless the memory was reused
    in between."""
    env = dict(os.environ if base is None else base)
    env["LD_PRELOAD"] = asan_runtime() + (" " + env["LD_PRELOAD"] if env.get("LD_PRELOAD") else "")
    env["ASAN_OPTIONS"] = ASAN_OPTIONS + (f":quarantine_size_mb={quarantine_mb}" if quarantine_mb is not None else "")
    env["UBSAN_OPTIONS"] = UBSAN_OPTIONS
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    return env


def backend_command() -> list[str]:
    """The command that runs `vrdma` with the sanitized modules (append its arguments: "backend", ...)."""
    return [sys.executable, "-m", "fuzz.sanitize", "run"]


def report_in(text: str) -> bool:
    return REPORT.search(text) is not None


class _SanitizedModules(importlib.abc.MetaPathFinder):
    """Finds the sanitized build of the backend's extension modules before the normal ones."""

    def __init__(self, modules: dict[str, str]) -> None:
        self.modules = modules

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
                  ) -> importlib.machinery.ModuleSpec | None:
        location = self.modules.get(fullname)
        if location is None:
            return None
        loader = importlib.machinery.ExtensionFileLoader(fullname, location)
        return importlib.util.spec_from_file_location(fullname, location, loader=loader)


def install() -> None:
    """Make this process import the sanitized modules (it must run with environment(): ASan preloaded)."""
    manifest = json.loads(MANIFEST.read_text()) if MANIFEST.exists() else {}
    modules = {name: entry["path"] for name, entry in manifest.items()}
    missing = sorted(set(BUILDS) - set(modules))
    if missing:
        raise SanitizeError(f"sanitizer build missing {', '.join(missing)}: run `python -m fuzz.sanitize build`")
    if "asan" not in os.environ.get("LD_PRELOAD", ""):
        raise SanitizeError("the sanitized modules need ASan's runtime preloaded: use fuzz.sanitize.environment()")
    sys.meta_path.insert(0, _SanitizedModules(modules))
    for name in BUILDS:
        __import__(name)
        print(f"{LOADED_NOTE} {name} from {sys.modules[name].__file__}", file=sys.stderr, flush=True)


def _run(argv: list[str]) -> int:
    try:
        install()
    except SanitizeError as err:
        print(err, file=sys.stderr)
        return 2
    from vrdma.cli import main

    return main(argv)


def main(argv: list[str]) -> int:
    if argv[:1] == ["run"]:
        return _run(argv[1:])
    if argv[:1] == ["build"]:
        build(verbose="-v" in argv)
        return 0
    if argv[:1] == ["env"]:
        env = environment({})
        for name in ("LD_PRELOAD", "ASAN_OPTIONS", "UBSAN_OPTIONS", "PYTHONPATH"):
            print(f"{name}={env[name]}")
        return 0
    print("usage: python -m fuzz.sanitize build [-v] | env | run VRDMA-ARGS...", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
