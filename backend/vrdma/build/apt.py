"""Debian archive access for the build chain.

Two views of the archive:
- the machine's own apt configuration (bookworm binaries: guest kernel and userland), queried as it is;
- a private apt configuration under the cache holding one deb-src entry for another suite (trixie, for the QEMU
  source). It has its own sources list, lists and cache directories, so the machine's apt sources and state
  stay exactly as they were.
"""

from __future__ import annotations

import logging
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from vrdma.build.cache import capture, run
from vrdma.errors import BuildError

log = logging.getLogger(__name__)

DEBIAN_KEYRING = Path("/usr/share/keyrings/debian-archive-keyring.gpg")
DEBIAN_MIRROR = "http://deb.debian.org/debian"


class PrivateSourceArchive:
    """apt with a private sources list containing only ``deb-src <mirror> <suite> main``."""

    def __init__(self, root: Path, suite: str, mirror: str = DEBIAN_MIRROR) -> None:
        self.root = root
        self.suite = suite
        self.mirror = mirror

    def _options(self) -> list[str]:
        r = self.root
        return [
            "-o", f"Dir::Etc::SourceList={r / 'sources.list'}",
            "-o", f"Dir::Etc::SourceParts={r / 'sources.list.d'}",
            "-o", f"Dir::Etc::Preferences={r / 'preferences'}",
            "-o", f"Dir::Etc::PreferencesParts={r / 'preferences.d'}",
            "-o", f"Dir::State::Lists={r / 'lists'}",
            "-o", f"Dir::State::status={r / 'status'}",
            "-o", f"Dir::Cache={r / 'cache'}",
            "-o", "APT::Sandbox::User=root",
        ]

    def update(self) -> None:
        r = self.root
        for sub in ("lists/partial", "cache/archives/partial", "sources.list.d", "preferences.d"):
            (r / sub).mkdir(parents=True, exist_ok=True)
        (r / "status").touch()
        if not DEBIAN_KEYRING.exists():
            raise BuildError(f"{DEBIAN_KEYRING} is missing: install debian-archive-keyring (`make deps`)")
        (r / "sources.list").write_text(
            f"deb-src [signed-by={DEBIAN_KEYRING}] {self.mirror} {self.suite} main\n")
        run(["apt-get", *self._options(), "update"])

    def source_version(self, package: str) -> str:
        out = capture(["apt-cache", *self._options(), "showsrc", "--only-source", package])
        versions = re.findall(r"^Version: (\S+)$", out, flags=re.M)
        if not versions:
            raise BuildError(f"no source package '{package}' in {self.suite}")
        return str(max(versions, key=_DebVersionKey))

    def download_source(self, package: str, version: str, dest: Path) -> Path:
        """Download a source package into ``dest`` and return the path of its .dsc."""
        dest.mkdir(parents=True, exist_ok=True)
        run(["apt-get", *self._options(), "source", "--download-only", f"{package}={version}"], cwd=dest)
        upstream = version.split(":", 1)[-1]
        dsc = dest / f"{package}_{upstream}.dsc"
        if not dsc.exists():
            raise BuildError(f"apt-get source did not produce {dsc}")
        return dsc


class _DebVersionKey:
    """Orders Debian versions with dpkg itself (rarely more than two candidates)."""

    def __init__(self, version: str) -> None:
        self.version = version

    def __lt__(self, other: _DebVersionKey) -> bool:
        compare = ["dpkg", "--compare-versions", self.version, "lt", other.version]
        return subprocess.run(compare, check=False).returncode == 0


@dataclass(frozen=True)
class Candidate:
    """What the machine's apt would install for a package name: its version and direct dependencies."""

    version: str
    depends: list[str]


def candidates(packages: list[str]) -> dict[str, Candidate]:
    """Candidate versions and Depends of several binary packages, in one apt-cache call.

    For a meta package such as linux-image-amd64, the first dependency names the current kernel ABI.
    """
    out = capture(["apt-cache", "show", "--no-all-versions", *packages])
    found: dict[str, Candidate] = {}
    for stanza in out.split("\n\n"):
        fields = dict(re.findall(r"^([A-Za-z-]+): (.*)$", stanza, flags=re.M))
        if "Package" not in fields or fields["Package"] in found:
            continue
        deps = [alt.split("|")[0].split("(")[0].strip() for alt in fields.get("Depends", "").split(",")]
        found[fields["Package"]] = Candidate(fields["Version"], [d for d in deps if d])
    missing = [p for p in packages if p not in found]
    if missing:
        raise BuildError(f"apt knows no package {', '.join(missing)}: run `apt-get update` (or `make deps`)")
    return found


def download(packages: list[str], dest: Path) -> list[Path]:
    """Download the candidate .debs of the named packages into ``dest`` with the machine's apt."""
    dest.mkdir(parents=True, exist_ok=True)
    run(["apt-get", "-o", "APT::Sandbox::User=root", "download", *packages], cwd=dest)
    return sorted(dest.glob("*.deb"))


def machine_sources() -> Path:
    """The machine's Debian sources file, so the guest image comes from the archive the host uses."""
    for candidate_path in (Path("/etc/apt/sources.list.d/debian.sources"), Path("/etc/apt/sources.list")):
        if candidate_path.is_file() and candidate_path.stat().st_size > 0:
            return candidate_path
    raise BuildError("no Debian apt sources found in /etc/apt (sources.list or sources.list.d/debian.sources)")
