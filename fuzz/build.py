"""Build the data engine's libFuzzer harness: build/fuzz/engine_fuzz, from fuzz/engine/*.c (engine_fuzz.c and its
helpers) and the engine's own C files (backend/vrdma/engine/*.c), with Debian's clang, libFuzzer,
AddressSanitizer and UndefinedBehaviorSanitizer.

Rebuilt only when an input (the sources, the headers, the flags) changed. ``python -m fuzz.build``;
``python -m fuzz.build --coverage`` reports the line and branch coverage of the engine's files by the corpus.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENGINE = ROOT / "backend" / "vrdma" / "engine"
ABI = ROOT / "guest-driver" / "include"  # the device API header, vrdma_dev_api.h
HARNESS_DIR = ROOT / "fuzz" / "engine"
OUT = ROOT / "build" / "fuzz" / "engine_fuzz"
# UBSan's checks abort (no recovery): a report must end the run and leave the input behind. Warnings are errors in
# the harness as in the engine.
FLAGS = ["-g", "-O1", "-fno-omit-frame-pointer", "-fsanitize=fuzzer,address,undefined",
         "-fno-sanitize-recover=undefined", "-Wall", "-Wextra", "-Werror", f"-I{ENGINE}", f"-I{ABI}"]
COMPILERS = ("clang-14", "clang")


class BuildError(Exception):
    pass


def compiler() -> str:
    for name in COMPILERS:
        path = shutil.which(name)
        if path:
            return path
    raise BuildError("clang is not installed: `make deps` installs clang-14 and libclang-rt-14-dev")


def engine_sources() -> list[Path]:
    return sorted(ENGINE.glob("*.c"))


def harness_sources() -> list[Path]:
    """The harness: engine_fuzz.c (what it does), vm.c and objects.c (its fake VMs and object operations)."""
    return sorted(HARNESS_DIR.glob("*.c"))


def engine_fuzzer() -> Path:
    cc = compiler()
    sources = [*harness_sources(), *engine_sources()]
    digest = hashlib.sha256(" ".join([cc, *FLAGS]).encode())
    for path in [*sources, *sorted(ENGINE.glob("*.h")), *sorted(HARNESS_DIR.glob("*.h")), ABI / "vrdma_dev_api.h"]:
        digest.update(path.read_bytes())
    key = digest.hexdigest()[:16]
    stamp = OUT.with_suffix(".stamp")
    if OUT.exists() and stamp.exists() and stamp.read_text().strip() == key:
        return OUT
    OUT.parent.mkdir(parents=True, exist_ok=True)
    result = subprocess.run([cc, *FLAGS, *map(str, sources), "-lz", "-o", str(OUT)], check=False,
                            capture_output=True, text=True)
    if result.returncode != 0:
        raise BuildError(f"building {OUT.name} failed:\n{result.stderr}")
    stamp.write_text(key + "\n")
    print(f"built {OUT.relative_to(ROOT)}")
    return OUT


def engine_coverage(corpora: list[Path]) -> str:
    """Line and branch coverage of the engine by the inputs in ``corpora`` (llvm-cov's report): the harness built
    again with clang's source-based coverage, without sanitizers, run once over every input."""
    cc = compiler()
    tools = {name: shutil.which(f"{name}-14") or shutil.which(name) for name in ("llvm-profdata", "llvm-cov")}
    if not all(tools.values()):
        raise BuildError("llvm-profdata and llvm-cov are needed: `make deps` installs llvm-14")
    binary = OUT.with_name("engine_cov")
    profile = OUT.with_name("engine_cov.profraw")
    merged = OUT.with_name("engine_cov.profdata")
    flags = ["-g", "-O0", "-fsanitize=fuzzer", "-fprofile-instr-generate", "-fcoverage-mapping", f"-I{ENGINE}",
             f"-I{ABI}"]
    subprocess.run([cc, *flags, *map(str, harness_sources()), *map(str, engine_sources()), "-lz", "-o",
                    str(binary)], check=True)
    subprocess.run([str(binary), "-runs=0", *map(str, corpora)], env={"LLVM_PROFILE_FILE": str(profile)},
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    subprocess.run([str(tools["llvm-profdata"]), "merge", "-sparse", str(profile), "-o", str(merged)], check=True)
    return subprocess.run([str(tools["llvm-cov"]), "report", str(binary), f"-instr-profile={merged}",
                           *map(str, engine_sources())], check=True, capture_output=True, text=True).stdout


if __name__ == "__main__":
    try:
        if sys.argv[1:2] == ["--coverage"]:
            engine_fuzzer()
            corpora = [d for d in (ROOT / "fuzz" / "corpus" / "engine", OUT.parent / "corpus" / "engine") if d.is_dir()]
            print(engine_coverage(corpora))
        else:
            engine_fuzzer()
    except BuildError as err:
        sys.exit(str(err))
