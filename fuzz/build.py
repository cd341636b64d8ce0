"""Build the data engine's libFuzzer harnesses with Debian's clang, libFuzzer, AddressSanitizer and
UndefinedBehaviorSanitizer: build/fuzz/engine_fuzz from fuzz/engine/*.c (rings, WQEs, page lists, doorbells) and
build/fuzz/roce_fuzz from fuzz/roce/*.c (the RoCE transport's state between two hosts), each with the engine's own
C files (backend/vrdma/engine/*.c); and build/fuzz/engine_threads_fuzz, the engine harness with the engine running
its own thread, under ThreadSanitizer.

Rebuilt only when an input (the sources, the headers, the flags) changed. ``python -m fuzz.build`` builds both;
``python -m fuzz.build --coverage [engine|roce]`` reports the line and branch coverage of the engine's files by
that harness's corpus.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

from vrdma._cffi_inplace import DEVICE_API_HEADERS

ROOT = Path(__file__).resolve().parents[1]
ENGINE = ROOT / "backend" / "vrdma" / "engine"
ABI = ROOT / "guest-driver" / "include"  # the device API header, vrdma_dev_api.h
# The native harnesses: each a folder of C files with one LLVMFuzzerTestOneInput, linked with the engine's files.
# engine_threads is the engine harness again, the engine running its own thread, under ThreadSanitizer.
HARNESSES = {"engine": ROOT / "fuzz" / "engine", "roce": ROOT / "fuzz" / "roce",
             "engine_threads": ROOT / "fuzz" / "engine"}
INPUT_HEADER = ROOT / "fuzz" / "input.h"  # how both read their input
OUT = ROOT / "build" / "fuzz" / "engine_fuzz"
ROCE_OUT = ROOT / "build" / "fuzz" / "roce_fuzz"
# UBSan's checks abort (no recovery): a report must end the run and leave the input behind. Warnings are errors in
# the harness as in the engine.
# VRE_CHECK_INVARIANTS: the engine holds its RoCE state to its invariants after every poll and packet (net.c).
FLAGS = ["-g", "-O1", "-fno-omit-frame-pointer", "-fsanitize=fuzzer,address,undefined",
         "-fno-sanitize-recover=undefined", "-Wall", "-Wextra", "-Werror", "-DVRE_CHECK_INVARIANTS", f"-I{ENGINE}",
         f"-I{ABI}", f"-I{INPUT_HEADER.parent}"]
# ThreadSanitizer cannot share a binary with ASan: the threaded build has it alone (and the engine's invariants).
# libFuzzer's coverage counters are plain bytes that both of the engine's threads would bump: ThreadSanitizer
# reports those as races, so the engine's files are not instrumented for coverage in this build (its inputs are the
# engine harness's corpus, which the ASan build's coverage grew; the harness's own code still guides mutation).
TSAN_COVERAGE_IGNORE = ROOT / "fuzz" / "engine" / "tsan-coverage-ignore.txt"
TSAN_FLAGS = ["-g", "-O1", "-fno-omit-frame-pointer", "-fsanitize=fuzzer,thread",
              f"-fsanitize-coverage-ignorelist={TSAN_COVERAGE_IGNORE}", "-Wall", "-Wextra", "-Werror",
              "-DVRE_CHECK_INVARIANTS", "-DFUZZ_ENGINE_THREAD", f"-I{ENGINE}", f"-I{ABI}", f"-I{INPUT_HEADER.parent}"]
FLAGS_OF = {"engine": FLAGS, "roce": FLAGS, "engine_threads": TSAN_FLAGS}
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


def harness_sources(name: str = "engine") -> list[Path]:
    """A harness's C files: engine_fuzz.c (what it does), vm.c and objects.c (its fake VMs and object operations);
    roce_fuzz.c (two hosts and the network between them)."""
    return sorted(HARNESSES[name].glob("*.c"))


def fuzzer(name: str) -> Path:
    """build/fuzz/<name>_fuzz, rebuilt when a source, a header or a flag changed."""
    cc = compiler()
    out = OUT.with_name(f"{name}_fuzz")
    sources = [*harness_sources(name), *engine_sources()]
    flags = FLAGS_OF[name]
    digest = hashlib.sha256(" ".join([cc, *flags]).encode())
    for path in [*sources, *sorted(ENGINE.glob("*.h")), *sorted(HARNESSES[name].glob("*.h")),
                 *(ABI / name for name in DEVICE_API_HEADERS), INPUT_HEADER, TSAN_COVERAGE_IGNORE]:
        digest.update(path.read_bytes())
    key = digest.hexdigest()[:16]
    stamp = out.with_suffix(".stamp")
    if out.exists() and stamp.exists() and stamp.read_text().strip() == key:
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    result = subprocess.run([cc, *flags, *map(str, sources), "-lz", "-o", str(out)], check=False,
                            capture_output=True, text=True)
    if result.returncode != 0:
        raise BuildError(f"building {out.name} failed:\n{result.stderr}")
    stamp.write_text(key + "\n")
    print(f"built {out.relative_to(ROOT)}")
    return out


def engine_coverage(corpora: list[Path], name: str = "engine") -> str:
    """Line and branch coverage of the engine by the inputs in ``corpora`` (llvm-cov's report): harness ``name``
    built again with clang's source-based coverage, without sanitizers, run once over every input."""
    cc = compiler()
    tools = {tool: shutil.which(f"{tool}-14") or shutil.which(tool) for tool in ("llvm-profdata", "llvm-cov")}
    if not all(tools.values()):
        raise BuildError("llvm-profdata and llvm-cov are needed: `make deps` installs llvm-14")
    binary = OUT.with_name(f"{name}_cov")
    profile = OUT.with_name(f"{name}_cov.profraw")
    merged = OUT.with_name(f"{name}_cov.profdata")
    flags = ["-g", "-O0", "-fsanitize=fuzzer", "-fprofile-instr-generate", "-fcoverage-mapping", f"-I{ENGINE}",
             f"-I{ABI}", f"-I{INPUT_HEADER.parent}"]
    subprocess.run([cc, *flags, *map(str, harness_sources(name)), *map(str, engine_sources()), "-lz", "-o",
                    str(binary)], check=True)
    subprocess.run([str(binary), "-runs=0", *map(str, corpora)], env={"LLVM_PROFILE_FILE": str(profile)},
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    subprocess.run([str(tools["llvm-profdata"]), "merge", "-sparse", str(profile), "-o", str(merged)], check=True)
    return subprocess.run([str(tools["llvm-cov"]), "report", str(binary), f"-instr-profile={merged}",
                           *map(str, engine_sources())], check=True, capture_output=True, text=True).stdout


if __name__ == "__main__":
    try:
        if sys.argv[1:2] == ["--coverage"]:
            name = sys.argv[2] if len(sys.argv) > 2 else "engine"
            fuzzer(name)
            corpora = [d for d in (ROOT / "fuzz" / "corpus" / name, OUT.parent / "corpus" / name) if d.is_dir()]
            print(engine_coverage(corpora, name))
        else:
            for harness in HARNESSES:
                fuzzer(harness)
    except BuildError as err:
        sys.exit(str(err))
