"""What packaging/ ships, held to the tools that read it: the systemd unit and its RoCE drop-in pass
`systemd-analyze verify`, the sysusers file makes the user and group, the example configuration loads."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from vrdma.daemon import config

ROOT = Path(__file__).resolve().parents[2]
PACKAGING = ROOT / "packaging"


def tool(name: str) -> str:
    path = shutil.which(name)
    assert path, f"{name} is missing: `make deps` installs it (Debian packages systemd, libvirt-clients)"
    return path


def installed_unit(tmp_path: Path, with_roce: bool) -> Path:
    """The unit as installed, its ExecStart and ExecReload pointing at this checkout's vrdma-backend and vrdma
    (verify checks that each program exists and is executable)."""
    text = (PACKAGING / "systemd" / "vrdma-backend.service").read_text()
    assert "ExecStart=/usr/bin/vrdma-backend " in text and "ExecReload=/usr/bin/vrdma admin upgrade" in text
    backend, cli = Path(sys.executable).parent / "vrdma-backend", Path(sys.executable).parent / "vrdma"
    assert backend.exists() and cli.exists(), (backend, cli)
    unit = tmp_path / "vrdma-backend.service"
    unit.write_text(text.replace("/usr/bin/vrdma-backend", str(backend)).replace("/usr/bin/vrdma ", f"{cli} "))
    if with_roce:
        (tmp_path / "vrdma-backend.service.d").mkdir()
        shutil.copy(PACKAGING / "systemd" / "roce.conf", tmp_path / "vrdma-backend.service.d" / "roce.conf")
    return unit


@pytest.mark.parametrize("with_roce", [False, True], ids=["unit", "unit+roce.conf"])
def test_the_unit_passes_systemd_analyze_verify(tmp_path: Path, with_roce: bool) -> None:
    unit = installed_unit(tmp_path, with_roce)
    # --man=no: the man page is the package's (checked in the full Debian guest, where it is installed).
    result = subprocess.run([tool("systemd-analyze"), "verify", "--man=no", str(unit)], capture_output=True,
                            text=True, timeout=60, check=False,
                            env={"SYSTEMD_UNIT_PATH": f"{tmp_path}:", "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0 and not result.stderr.strip(), result


def test_the_unit_is_sandboxed(tmp_path: Path) -> None:
    """`systemd-analyze security` rates the unit: no worse than "OK" (2.0 when written)."""
    unit = installed_unit(tmp_path, with_roce=False)
    result = subprocess.run([tool("systemd-analyze"), "security", "--offline=yes", "--threshold=30", str(unit)],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result
    level = result.stdout.split("Overall exposure level for vrdma-backend.service:")[1].split()[0]
    assert float(level) <= 3.0, result.stdout[-2000:]


def test_sysusers_makes_the_user_and_group(tmp_path: Path) -> None:
    (tmp_path / "etc").mkdir()
    result = subprocess.run([tool("systemd-sysusers"), f"--root={tmp_path}",
                             str(PACKAGING / "systemd" / "vrdma.sysusers")],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result
    passwd = (tmp_path / "etc" / "passwd").read_text()
    group = (tmp_path / "etc" / "group").read_text()
    assert passwd.startswith("vrdma:x:") and "/usr/sbin/nologin" in passwd, passwd
    assert group.startswith("vrdma:x:"), group


def test_the_example_configuration_loads() -> None:
    loaded = config.load(PACKAGING / "backend.toml")
    assert loaded.admin_socket == Path(config.DEFAULT_ADMIN_SOCKET)
    assert loaded.metrics == "127.0.0.1:9717" and not loaded.roce and loaded.vms == []


def test_the_libvirt_domain_validates() -> None:
    """packaging/libvirt/vrdma-guest.xml against libvirt's own schema (virt-xml-validate)."""
    domain = PACKAGING / "libvirt" / "vrdma-guest.xml"
    result = subprocess.run([tool("virt-xml-validate"), str(domain), "domain"], capture_output=True, text=True,
                            timeout=60, check=False)
    assert result.returncode == 0 and "validates" in result.stdout + result.stderr, result
    broken = domain.read_text().replace("<memoryBacking>", "<memoryBacking><nonsense/>")
    result = subprocess.run([tool("virt-xml-validate"), "-", "domain"], input=broken, capture_output=True,
                            text=True, timeout=60, check=False)
    assert result.returncode != 0, "the validator accepts anything: the check above proves nothing"


def _dkms_conf() -> dict[str, str]:
    text = (ROOT / "guest-driver" / "dkms.conf").read_text()
    return dict(re.findall(r'^([A-Z_\[\]0-9]+)="(.*)"$', text, flags=re.M))


def test_dkms_conf_names_the_projects_version_and_builds_on_kernel_upgrades() -> None:
    """vrdma-dkms installs the module's source as /usr/src/vrdma-<version>: dkms.conf, the package (its changelog)
    and the Python project must agree on that version."""
    conf = _dkms_conf()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    changelog = (ROOT / "packaging" / "debian" / "changelog").read_text().split("\n", 1)[0]
    assert conf["PACKAGE_NAME"] == "vrdma" and conf["PACKAGE_VERSION"] == project
    assert changelog.startswith(f"vrdma ({project}) ")
    assert conf["AUTOINSTALL"] == "yes"  # built again for each kernel installed later
    assert conf["BUILT_MODULE_NAME[0]"] == "vrdma" and conf["BUILT_MODULE_LOCATION[0]"] == "kernel/"


def test_the_package_sources_are_complete() -> None:
    """What debhelper needs in each source package (packages.py stages the rest: the unit, sysusers, dkms.conf)."""
    for source in ("debian", "libvrdma/debian"):
        directory = ROOT / "packaging" / source
        for name in ("control", "rules", "changelog", "copyright", "source/format"):
            assert (directory / name).is_file(), directory / name
        assert (directory / "rules").stat().st_mode & 0o111, "debian/rules must be executable"
    assert (ROOT / "packaging" / "systemd" / "vrdma-backend.service").is_file()
