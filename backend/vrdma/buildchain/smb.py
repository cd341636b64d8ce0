"""`make smb-direct`: cifs.ko and ksmbd.ko with SMB Direct (SMB3 over RDMA) for the default guest kernel.

Debian builds its kernels without ``CONFIG_CIFS_SMB_DIRECT`` and ``CONFIG_SMB_SERVER_SMBDIRECT`` (6.1, 6.12 and
7.3 alike), so the two modules are built out of tree from the kernel's own source with the options on:
``linux-source-<series>`` at the kernel's exact version (Debian's patched source; the mirror here has no upstream
tarball of a security update), of which fs/smb and fs/nls are used. Debian's headers do not ship
``scripts/asn1_compiler``, which the SPNEGO parsers of both modules are generated with: it is compiled from the same
source on the host (it writes C source, nothing of the host goes into the modules) and run before kbuild. The
modules are built in the kernel's build root like vrdma.ko, and replace the in-tree ones in the guest image.
"""

from __future__ import annotations

import logging
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

from vrdma.buildchain import kernel
from vrdma.buildchain.cache import CachedProduct, capture, run, step
from vrdma.errors import BuildError

log = logging.getLogger(__name__)

RECIPE_VERSION = 2
# The guest kernels the image carries SMB Direct for: the default one (the storage tests run there).
KERNELS = ("trixie",)
# Each module: its directory in the source, the options turned on, and the SPNEGO grammars it is generated from.
MODULES = {
    "cifs": ("fs/smb/client", ["CONFIG_CIFS=m", "CONFIG_CIFS_SMB_DIRECT=y", "KCFLAGS=-DCONFIG_CIFS_SMB_DIRECT=1"],
             ["cifs_spnego_negtokeninit"]),
    "ksmbd": ("fs/smb/server", ["CONFIG_SMB_SERVER=m", "CONFIG_SMB_SERVER_SMBDIRECT=y",
                                "KCFLAGS=-DCONFIG_SMB_SERVER_SMBDIRECT=1"],
              ["ksmbd_spnego_negtokeninit", "ksmbd_spnego_negtokentarg"]),
}
SOURCE_PATHS = ["fs/smb", "fs/nls", "scripts/asn1_compiler.c", "include/linux/asn1.h",
                "include/linux/asn1_ber_bytecode.h"]


def build(kernel_name: str = kernel.DEFAULT_KERNEL) -> dict[str, Any]:
    target = kernel.kernel_product("kernel", kernel_name)
    if "build_root_dir" not in target:
        raise BuildError(f"SMB Direct modules are built for kernels with a build root, not {kernel_name}")
    series = ".".join(target["release"].split(".")[:2])
    package = f"linux-source-{series}"
    cached = CachedProduct("smb-direct", {"kernel": target["version"], "release": target["release"],
                                          "modules": MODULES, "recipe": RECIPE_VERSION})
    if not cached.complete:
        with cached.building() as scratch:
            _build_into(scratch, kernel.guest_kernel(kernel_name), target, package)
    info = {"release": target["release"], "key": cached.key,
            "module_paths": [str(cached.path / f"{name}.ko") for name in MODULES],
            "depends": sorted({d for name in MODULES
                               for d in capture(["modinfo", "-F", "depends", cached.path / f"{name}.ko"])
                               .strip().split(",") if d})}
    kernel.record_kernel_product("smb-direct", kernel_name, info)
    log.info("SMB Direct modules for %s: %s", target["release"], ", ".join(info["module_paths"]))
    return info


def _build_into(scratch: Path, guest: kernel.GuestKernel, target: dict[str, Any], package: str) -> None:
    archive = kernel.kernel_archive(guest)
    assert archive is not None
    with step(f"downloading {package} {target['version']}"):
        (deb,) = archive.download({package: target["version"]}, scratch / "debs")
    tree = scratch / "src"
    with step(f"unpacking {', '.join(SOURCE_PATHS)} from it"):
        tree.mkdir()
        inner = subprocess.run(f"dpkg-deb --fsys-tarfile {deb} | tar -xO --wildcards './usr/src/linux-source-*.tar.*'",
                               shell=True, capture_output=True, check=False)
        if inner.returncode != 0 or not inner.stdout:
            raise BuildError(f"{deb.name} holds no source tarball: {inner.stderr.decode(errors='replace')[-500:]}")
        (scratch / "source.tar").write_bytes(inner.stdout)
        top = f"linux-source-{package.removeprefix('linux-source-')}"
        run(["tar", "-C", tree, "--strip-components=1", "-xf", scratch / "source.tar",
             *(f"{top}/{p}" for p in SOURCE_PATHS)])
        (scratch / "source.tar").unlink()
    with step("generating the SPNEGO parsers (asn1_compiler, compiled from the same source)"):
        compiler = scratch / "asn1_compiler"
        run(["gcc", "-O2", "-I", tree / "include", "-o", compiler, tree / "scripts" / "asn1_compiler.c"])
        for directory, _, grammars in MODULES.values():
            for grammar in grammars:
                base = tree / directory / grammar
                run([compiler, f"{base}.asn1", f"{base}.asn1.c", f"{base}.asn1.h"])
    for name, (directory, options, _) in MODULES.items():
        with step(f"building {name}.ko with SMB Direct against {target['release']}"):
            kernel.kbuild(target, tree, directory, scratch / "logs" / f"{name}.log", "-j2", *options)
            module = tree / directory / f"{name}.ko"
            kernel.check_vermagic(module, target["release"])
            symbols = capture(["nm", module])
            if not re.search(r" (smbd_|smb_direct_)", symbols):
                raise BuildError(f"{name}.ko was built without its SMB Direct transport")
            shutil.copy2(module, scratch / f"{name}.ko")  # with its debug information, as vrdma.ko's product
    shutil.rmtree(tree)
