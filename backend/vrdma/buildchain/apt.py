"""Debian archive access for the build chain.

Two views of the archive:
- the machine's own apt configuration (bookworm binaries: the guest kernel), queried as it is;
- a private apt configuration under the cache for another suite (trixie: the guest's userland, the QEMU and
  rdma-core sources). It has its own sources list, lists and cache directories, so the machine's apt sources
  and state stay exactly as they were.
"""

from __future__ import annotations

import logging
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from vrdma import paths
from vrdma.buildchain.cache import capture, file_digest, run
from vrdma.errors import BuildError

log = logging.getLogger(__name__)

DEBIAN_KEYRING = Path("/usr/share/keyrings/debian-archive-keyring.gpg")
DEBIAN_MIRROR = "http://deb.debian.org/debian"
DEBIAN_SECURITY_MIRROR = "http://deb.debian.org/debian-security"
# The guest's userland suite. Trixie, not the host's bookworm: the provider must be compiled in the source tree
# of the guest's own rdma-core, and Debian's mirror no longer has bookworm's rdma-core 44 upstream tarball
# (docs/guest-driver.md). The guest kernels are several (buildchain.kernel.GUEST_KERNELS).
GUEST_SUITE = "trixie"


class PrivateArchive:
    """apt with a private sources list for one Debian suite (with its -updates and -security suites, and with
    ``backports`` its -backports suite too).

    Only the archive of the newest guest kernel (buildchain.kernel) has -backports: apt gives it a low priority, so
    nothing comes from it unless asked by name (``release=``), but a source package's versions are listed from every
    suite (``source_version`` would take QEMU from it), and the image, the provider and QEMU use the suite as
    released.

    Binary and source entries both: the guest image's packages come from here (through mmdebstrap, given
    ``binary_sources``), and so do the sources built against them (QEMU, rdma-core).
    """

    def __init__(self, root: Path, suite: str, mirror: str = DEBIAN_MIRROR,
                 security_mirror: str = DEBIAN_SECURITY_MIRROR, backports: bool = False) -> None:
        self.root = root
        self.suite = suite
        self.backports = backports
        self.mirror = mirror
        self.security_mirror = security_mirror
        self.binary_sources = root / "binary.list"

    @classmethod
    def for_suite(cls, suite: str, backports: bool = False) -> PrivateArchive:
        """The archive of ``suite`` kept under the cache directory (shared by every build that uses the suite;
        the one with -backports apart)."""
        return cls(paths.cache_dir() / "apt" / (f"{suite}+backports" if backports else suite), suite,
                   backports=backports)

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
            "-o", "APT::Architecture=amd64",
            "-o", "APT::Sandbox::User=root",
        ]

    def update(self) -> None:
        r = self.root
        for sub in ("lists/partial", "cache/archives/partial", "sources.list.d", "preferences.d"):
            (r / sub).mkdir(parents=True, exist_ok=True)
        (r / "status").touch()
        if not DEBIAN_KEYRING.exists():
            raise BuildError(f"{DEBIAN_KEYRING} is missing: install debian-archive-keyring (`make deps`)")
        signed = f"[signed-by={DEBIAN_KEYRING}]"
        # One suite per line: a second word after the suite would be read as a component.
        suites = [self.suite, f"{self.suite}-updates", *([f"{self.suite}-backports"] if self.backports else [])]
        entries = [*(f"{signed} {self.mirror} {suite} main" for suite in suites),
                   f"{signed} {self.security_mirror} {self.suite}-security main"]
        self.binary_sources.write_text("".join(f"deb {e}\n" for e in entries))
        (r / "sources.list").write_text("".join(f"{kind} {e}\n" for kind in ("deb", "deb-src") for e in entries))
        run(["apt-get", *self._options(), "update"])

    def candidates(self, packages: list[str], release: str | None = None) -> dict[str, Candidate]:
        """What this suite would install for the named binary packages (from ``release``, e.g. the backports
        suite, first when given)."""
        target = ["-o", f"APT::Default-Release={release}"] if release else []
        return _parse_candidates(capture(["apt-cache", *self._options(), *target, "show", "--no-all-versions",
                                          *packages]), packages)

    def download(self, packages: dict[str, str], dest: Path) -> list[Path]:
        """Download the named binary packages, each at the given version, into ``dest``."""
        dest.mkdir(parents=True, exist_ok=True)
        run(["apt-get", *self._options(), "download", *(f"{p}={v}" for p, v in packages.items())], cwd=dest)
        return sorted(dest.glob("*.deb"))

    def source_version(self, package: str) -> str:
        return max(self._source_stanzas(package), key=_DebVersionKey)

    def _source_stanzas(self, package: str) -> dict[str, dict[str, str]]:
        out = capture(["apt-cache", *self._options(), "showsrc", "--only-source", package])
        stanzas: dict[str, dict[str, str]] = {}
        for stanza in out.split("\n\n"):
            fields = dict(re.findall(r"^([A-Za-z0-9-]+):[ ]?((?:.*)(?:\n[ ].*)*)", stanza, flags=re.M))
            if "Version" in fields:
                stanzas[fields["Version"].strip()] = fields
        if not stanzas:
            raise BuildError(f"no source package '{package}' in {self.suite}")
        return stanzas

    def unpack_source(self, package: str, version: str, downloads: Path, dest: Path, log_file: Path) -> None:
        """Download a source package's files (each checked against the index's SHA-256) and unpack it into
        ``dest`` with Debian's patches applied.

        The .dsc is used when the mirror has it; some mirrors lack a package's .dsc while holding its tarballs,
        and then the "3.0 (quilt)" format is unpacked by hand, as dpkg-source would: upstream tarball, debian/
        tarball, then debian/patches/series in order.
        """
        fields = self._source_stanzas(package).get(version)
        if fields is None:
            raise BuildError(f"{self.suite} has no source package {package}={version}")
        downloads.mkdir(parents=True, exist_ok=True)
        files = re.findall(r"^ ([0-9a-f]{64}) \d+ (\S+)$", fields.get("Checksums-Sha256", ""), flags=re.M)
        if not files:
            raise BuildError(f"the index lists no files for {package}={version}")
        have: list[Path] = []
        for sha256, name in files:
            target = downloads / name
            if not target.exists() or file_digest(target) != sha256:
                url = f"{self.mirror}/{fields['Directory'].strip()}/{name}"
                proc = subprocess.run(["/usr/lib/apt/apt-helper", "download-file", url, target, f"SHA256:{sha256}"],
                                      capture_output=True, text=True, check=False)
                if proc.returncode != 0:
                    if name.endswith(".dsc"):
                        log.info("the mirror has no %s; unpacking the tarballs directly", name)
                        continue
                    raise BuildError(f"could not download {url}: {proc.stderr.strip() or proc.stdout.strip()}")
            have.append(target)
        dscs = [p for p in have if p.name.endswith(".dsc")]
        if dscs:
            run(["dpkg-source", "--no-check", "-x", dscs[0], dest], log_file=log_file)
            return
        if fields.get("Format", "").strip() != "3.0 (quilt)":
            raise BuildError(f"{package}={version}: no .dsc on the mirror and format is not 3.0 (quilt)")
        orig = [p for p in have if ".orig.tar." in p.name]
        debian = [p for p in have if ".debian.tar." in p.name]
        if len(orig) != 1 or len(debian) != 1:
            raise BuildError(f"{package}={version}: expected one upstream and one debian tarball, got "
                             f"{[p.name for p in have]}")
        dest.mkdir(parents=True)
        run(["tar", "-C", dest, "--strip-components=1", "-xf", orig[0]], log_file=log_file)
        run(["tar", "-C", dest, "-xf", debian[0]], log_file=log_file)
        series = dest / "debian" / "patches" / "series"
        patches = series.read_text().split("\n") if series.exists() else []
        for entry in patches:
            name = entry.split("#", 1)[0].strip()
            if name:
                run(["patch", "-p1", "--forward", "--batch", "-i", dest / "debian" / "patches" / name.split()[0]],
                    cwd=dest, log_file=log_file)


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
    source: str = ""  # "name" or "name (version)" when the source differs from the binary; empty when the same


def candidates(packages: list[str]) -> dict[str, Candidate]:
    """Candidate versions and Depends of several binary packages, in one apt-cache call.

    For a meta package such as linux-image-amd64, the first dependency names the current kernel ABI.
    """
    return _parse_candidates(capture(["apt-cache", "show", "--no-all-versions", *packages]), packages)


def _parse_candidates(out: str, packages: list[str]) -> dict[str, Candidate]:
    found: dict[str, Candidate] = {}
    for stanza in out.split("\n\n"):
        fields = dict(re.findall(r"^([A-Za-z-]+): (.*)$", stanza, flags=re.M))
        if "Package" not in fields or fields["Package"] in found:
            continue
        deps = [alt.split("|")[0].split("(")[0].strip() for alt in fields.get("Depends", "").split(",")]
        found[fields["Package"]] = Candidate(fields["Version"], [d for d in deps if d], fields.get("Source", ""))
    missing = [p for p in packages if p not in found]
    if missing:
        raise BuildError(f"apt knows no package {', '.join(missing)}: run `apt-get update` (or `make deps`)")
    return found


def download(packages: list[str], dest: Path) -> list[Path]:
    """Download the candidate .debs of the named packages into ``dest`` with the machine's apt."""
    dest.mkdir(parents=True, exist_ok=True)
    run(["apt-get", "-o", "APT::Sandbox::User=root", "download", *packages], cwd=dest)
    return sorted(dest.glob("*.deb"))
