"""`make image`: the guest root filesystem, an initramfs made of Debian packages (the guest suite, trixie).

The packages are unpacked, not installed (mmdebstrap's ``extract`` variant: no maintainer scripts run, nothing
is emulated), trimmed of documentation, given busybox init, the project's start-up script, the kernel modules
the guest needs (with their dependencies, resolved from the kernel's modules.dep), libvrdma (the provider,
built in this very rdma-core's source tree) and precompiled Python bytecode, and packed as one uncompressed
cpio archive: the guest boots straight into it, with no disk, and each guest gets a private writable copy.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vrdma.buildchain import apt, kernel, smb
from vrdma.buildchain.cache import CachedProduct, content_key, file_digest, product, run, step
from vrdma.buildchain.provider import rdma_core_source
from vrdma.errors import BuildError

log = logging.getLogger(__name__)

SUITE = apt.GUEST_SUITE
PACKAGES = [
    "busybox-static",      # init, shell and the small tools (lspci, mount, ...)
    "kmod",                # modprobe that understands modules.dep and aliases
    "iproute2",            # ip and the `rdma` tool
    "iputils-ping",
    "pciutils",            # lspci (Debian's busybox has none)
    "qemu-guest-agent",    # how the host runs commands in the guest
    "libibverbs1",
    "ibverbs-utils",       # ibv_devices, ibv_devinfo, ibv_rc_pingpong, ...
    "ibverbs-providers",   # librxe and the other user-space providers
    "librdmacm1t64",
    "rdmacm-utils",
    "perftest",
    "python3-pyverbs",
    "nvme-cli",            # NVMe over Fabrics: nvme connect/disconnect/list
    "fio",                 # I/O with verification on the remote namespaces
    "nfs-kernel-server",   # NFS over RDMA: rpc.nfsd, rpc.mountd, exportfs (and nfs-common's mount.nfs)
    "targetcli-fb",        # iSER: the LIO target's configuration tool
    "dbus-daemon",         # ... which asks the system bus for tcmu-runner's backstores (and fails without a bus)
    "open-iscsi",          # iSER: iscsid and iscsiadm, the initiator
    "ksmbd-tools",         # SMB Direct: ksmbd.mountd and its configuration tools, the server
    "cifs-utils",          # ... and mount.cifs, the client
]
# Kernel modules shipped, with everything modules.dep says they need: rc.sysinit loads the virtio and RDMA ones at
# boot, the rest are loaded when a test asks for them (NVMe over Fabrics, host and target, over RDMA and TCP; NFS;
# iSER).
MODULES = ["virtio_pci", "virtio_net", "virtio_console", "virtio_blk",
           "ib_core", "ib_uverbs", "ib_umad", "rdma_ucm", "rdma_rxe",
           "nvme_rdma", "nvmet_rdma", "nvme_tcp", "nvmet_tcp",
           "nfsd", "nfsv4", "rpcrdma",  # NFS over RDMA, server and client
           "ib_isert", "ib_iser", "sd_mod"]  # iSER, target and initiator, and the disk its LUN becomes
# Modules no modules.dep edge leads to, because their users ask the crypto API for an algorithm by name: rxe for
# "crc32", iSCSI for "crc32c" at every login, t10-pi for the last two. Shipped where a kernel builds them as modules;
# newer kernels (7.x) compute these checksums with library calls instead and have none of them.
BY_NAME_MODULES = ["crc32_generic", "crc32c_generic", "crc64_rocksoft_generic", "crct10dif_generic",
                   # SMB3's signing and encryption (cifs and ksmbd ask for cmac(aes), gcm(aes), ccm(aes) by name)
                   "cmac", "gcm", "ccm", "ghash_clmulni_intel", "aesni_intel", "md4", "des_generic"]
# Paths dropped from the unpacked packages: documentation and data nothing in the guest reads, and what packages
# drag in that the image never runs: systemd and udev (open-iscsi depends on udev, udev on systemd; the image boots
# busybox init and loads modules itself, and iscsid needs only libsystemd.so), perl (debconf's), glibc's charset
# converters (nothing calls iconv beyond UTF-8), Python's documentation data and test package, time zones.
EXCLUDES = ["usr/share/doc", "usr/share/man", "usr/share/info", "usr/share/locale", "usr/share/lintian",
            "usr/share/bash-completion", "lib/udev/hwdb.d", "usr/lib/udev",
            "usr/lib/systemd", "usr/lib/x86_64-linux-gnu/systemd", "usr/bin/systemd*", "usr/bin/systemctl",
            "usr/bin/journalctl", "usr/bin/udevadm", "usr/bin/perl*", "usr/lib/x86_64-linux-gnu/perl*",
            "usr/share/perl*", "usr/lib/x86_64-linux-gnu/gconv", "usr/lib/python3.13/pydoc_data",
            "usr/lib/python3.13/test", "usr/share/zoneinfo"]
# ... except what the guest does read there: rdma-core's own test suite (shipped by python3-pyverbs).
KEEP = ["usr/share/doc/rdma-core/tests"]
GUEST_FILES = Path(__file__).with_name("guest")
COMPCHAN_LIBRARY = "libvrdma-compchan.so"


def build(kernel_name: str = kernel.DEFAULT_KERNEL) -> dict[str, Any]:
    """The image of one guest kernel: the root filesystem every kernel shares, then that kernel's modules, two
    cpio archives one after the other (the kernel unpacks each archive of a concatenation in turn)."""
    target = kernel.kernel_product("kernel", kernel_name)
    driver = kernel.kernel_product("driver", kernel_name)
    smb_direct = smb.build(kernel_name) if kernel_name in smb.KERNELS else None
    rootfs = _rootfs()
    cached = CachedProduct("image", {"rootfs": rootfs.key, "kernel": target["version"],
                                     "release": target["release"], "modules": MODULES, "by_name": BY_NAME_MODULES,
                                     "driver": driver["key"], "smb": smb_direct["key"] if smb_direct else None,
                                     "recipe": file_digest(Path(__file__))})
    if cached.complete:
        log.info("guest image for %s is cached in %s", kernel_name, cached.path)
    else:
        with cached.building() as scratch, step(f"adding {kernel_name}'s kernel modules, {target['release']}"):
            root = scratch / "modules"
            own = [Path(driver["module_path"]), *map(Path, driver["test_modules"])]
            if smb_direct:  # cifs.ko and ksmbd.ko with SMB Direct, in place of the kernel's (not shipped)
                own += map(Path, smb_direct["module_paths"])
            _add_modules(root, Path(target["modules_dir"]), target["release"], own,
                         smb_direct["depends"] if smb_direct else [])
            _pack_cpio(root, scratch / "modules.cpio")
            shutil.rmtree(root)
            with (scratch / "initrd.cpio").open("wb") as out:
                for part in (rootfs.path / "rootfs.cpio", scratch / "modules.cpio"):
                    with part.open("rb") as src:
                        shutil.copyfileobj(src, out, 1 << 20)
            (scratch / "modules.cpio").unlink()
    initrd = cached.path / "initrd.cpio"
    info = {"initrd_path": str(initrd), "kernel_release": target["release"],
            "size_mib": round(initrd.stat().st_size / 2**20, 1),
            # the root filesystem alone: containers' root (vrdma.harness.container), the same programs as a guest's
            "rootfs_path": str(rootfs.path / "rootfs.cpio"), "rootfs_key": rootfs.key}
    kernel.record_kernel_product("image", kernel_name, info)
    return info


def _rootfs() -> CachedProduct:
    """The guest's root filesystem without kernel modules, packed: the same for every guest kernel."""
    provider = product("provider")
    archive = apt.PrivateArchive.for_suite(SUITE)
    with step(f"resolving the guest packages in Debian {SUITE}"):
        archive.update()
        versions = {pkg: c.version for pkg, c in archive.candidates(PACKAGES).items()}
        rdma_core = rdma_core_source(archive)  # the provider's own rule, so both agree
    if rdma_core != provider["rdma_core_version"]:
        raise BuildError(f"libvrdma was built for rdma-core {provider['rdma_core_version']}, but {SUITE} now has "
                         f"{rdma_core}: run `make provider` (or `make image`, which does)")
    recipe = {name: file_digest(GUEST_FILES / name) for name in sorted(os.listdir(GUEST_FILES))}
    recipe["image.py"] = file_digest(Path(__file__))
    cached = CachedProduct("rootfs", {"packages": versions, "excludes": EXCLUDES, "keep": KEEP,
                                      "recipe": content_key(recipe), "provider": provider["key"]})
    if cached.complete:
        log.info("guest root filesystem is cached in %s", cached.path)
    else:
        with cached.building() as scratch:
            _build_rootfs(scratch, archive, provider)
    return cached


def _build_rootfs(out: Path, archive: apt.PrivateArchive, provider: dict[str, Any]) -> None:
    tarball = out / "rootfs.tar"
    with step(f"unpacking {len(PACKAGES)} Debian {SUITE} packages and their dependencies (mmdebstrap)"):
        run(["mmdebstrap", "--variant=extract", "--include=" + ",".join(PACKAGES), "--format=tar",
             SUITE, tarball, archive.binary_sources], log_file=out / "logs" / "mmdebstrap.log")
    root = out / "root"
    root.mkdir()
    with step("assembling the root filesystem"):
        run(["tar", "-C", root, "-xf", tarball, *(f"--exclude=./{x}" for x in EXCLUDES)])
        run(["tar", "-C", root, "-xf", tarball, *(f"./{k}" for k in KEEP)])
        tarball.unlink()
        _add_base_files(root)
        _add_provider(root, provider)
        run(["ldconfig", "-r", root])
        _compile_python(root)
    with step("packing the initramfs"):
        _pack_cpio(root, out / "rootfs.cpio")
        shutil.rmtree(root)


def _add_base_files(root: Path) -> None:
    """What base-files, init and udev would provide, reduced to what this image uses."""
    # Merged /usr: trixie's packages ship only /usr paths and base-files (not unpacked here) makes these links.
    for top in ("bin", "sbin", "lib", "lib64"):
        if not (root / top).exists() and not (root / top).is_symlink():
            (root / "usr" / top).mkdir(parents=True, exist_ok=True)
            (root / top).symlink_to(f"usr/{top}")
    for d in ("proc", "sys", "dev", "run", "tmp", "root", "etc/vrdma", "var/log", "var/tmp"):
        (root / d).mkdir(parents=True, exist_ok=True)
    (root / "tmp").chmod(0o1777)
    var_run = root / "var" / "run"
    if not var_run.exists():
        var_run.symlink_to("../run")
    init = root / "init"
    init.unlink(missing_ok=True)
    init.symlink_to("bin/busybox")  # the kernel runs /init; busybox runs its init applet by that name
    shutil.copy(GUEST_FILES / "inittab", root / "etc" / "inittab")
    shutil.copy(GUEST_FILES / "rc.sysinit", root / "etc" / "vrdma" / "rc.sysinit")
    (root / "etc" / "vrdma" / "rc.sysinit").chmod(0o755)
    (root / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
    (root / "etc" / "group").write_text("root:x:0:\n")
    (root / "etc" / "hosts").write_text("127.0.0.1\tlocalhost\n::1\tlocalhost\n")
    ld_conf = root / "etc" / "ld.so.conf"
    if not ld_conf.exists():
        ld_conf.write_text("include /etc/ld.so.conf.d/*.conf\n")
    # busybox applets for every tool no package provides (sh, mount, lspci, ...); existing files win.
    applets = subprocess.run([root / "bin" / "busybox", "--list-full"], capture_output=True, text=True,
                             check=True).stdout.split()
    for applet in applets:
        target = root / applet
        if not target.exists() and not target.is_symlink():
            target.parent.mkdir(parents=True, exist_ok=True)
            target.symlink_to("/bin/busybox")


def _module_name(path: str) -> str:
    return Path(path).name.split(".ko")[0].replace("-", "_")


def module_closure(modules_dir: Path, wanted: list[str], optional: Sequence[str] = ()) -> list[str]:
    """Relative paths of the wanted modules and everything they depend on, per modules.dep. A wanted module built
    into the kernel (modules.builtin) needs nothing; an optional one the kernel lacks is left out."""
    deps: dict[str, list[str]] = {}
    by_name: dict[str, str] = {}
    for line in (modules_dir / "modules.dep").read_text().splitlines():
        path, _, rest = line.partition(":")
        deps[path] = rest.split()
        by_name[_module_name(path)] = path
    builtin_list = modules_dir / "modules.builtin"
    builtin = {_module_name(p) for p in builtin_list.read_text().split()} if builtin_list.exists() else set()
    missing = [m for m in wanted if m not in by_name and m not in builtin]
    if missing:
        raise BuildError(f"kernel modules not found in {modules_dir}: {', '.join(missing)}")
    closure: set[str] = set()
    pending = [by_name[m] for m in [*wanted, *optional] if m in by_name]
    while pending:
        path = pending.pop()
        if path not in closure:
            closure.add(path)
            pending.extend(deps[path])
    return sorted(closure)


def _add_modules(root: Path, modules_dir: Path, release: str, own_modules: list[Path],
                 own_depends: Sequence[str] = ()) -> None:
    """The modules the guest loads, in a tree of their own (``root``) packed after the root filesystem."""
    dest = root / "usr" / "lib" / "modules" / release
    dest.mkdir(parents=True)
    (dest / "extra").mkdir()
    for module in own_modules:  # the project's driver and its tests, found by modprobe after depmod
        # without their debug information (vrdma.ko is 6.7 MiB with it, a tenth without): `make driver`'s
        # products keep it for whoever debugs them
        run(["strip", "--strip-debug", "-o", dest / "extra" / module.name, module])
    for rel in module_closure(modules_dir, [*MODULES, *own_depends], BY_NAME_MODULES):
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(modules_dir / rel, dest / rel)
    for meta in ("modules.builtin", "modules.builtin.modinfo", "modules.order"):
        if (modules_dir / meta).exists():
            shutil.copy2(modules_dir / meta, dest / meta)
    # The host's depmod looks under <root>/lib/modules; in the guest /lib is a link to usr/lib, which the archive
    # must not carry (unpacked over the root filesystem, a directory or link of another type replaces what is there).
    (root / "lib").symlink_to("usr/lib")
    run(["depmod", "-b", root, release])
    (root / "lib").unlink()


def _add_provider(root: Path, provider: dict[str, Any]) -> None:
    """libvrdma where Debian's libibverbs looks for providers, and the file that tells it to load it."""
    library = Path(provider["library_path"])
    provider_dir = root / "usr" / "lib" / "x86_64-linux-gnu" / "libibverbs"
    if not provider_dir.is_dir():
        raise BuildError(f"{provider_dir} is missing: did ibverbs-providers change its layout?")
    shutil.copy2(library, provider_dir / library.name)
    shutil.copy2(provider["driver_file"], root / "etc" / "libibverbs.d" / "vrdma.driver")
    # A container's image preloads it (vrdma.harness.container, docs/containers.md); a guest's does not.
    shutil.copy2(provider["compchan_path"], root / "usr" / "lib" / "x86_64-linux-gnu" / COMPCHAN_LIBRARY)


def _compile_python(root: Path) -> None:
    """Precompile the guest's Python so that every `import pyverbs` under TCG does not compile the stdlib.

    The guest's own interpreter does it (through chroot: same architecture, its own libraries), so the
    bytecode matches its version whatever the host runs.
    """
    python = os.path.realpath(root / "usr" / "bin" / "python3")
    tag = Path(python).name  # python3.13
    dirs = [d for d in (f"/usr/lib/{tag}", "/usr/lib/python3/dist-packages") if (root / d.lstrip("/")).is_dir()]
    run(["chroot", root, f"/usr/bin/{tag}", "-m", "compileall", "-q", "-j", "0",
         "-x", r"(lib2to3/tests|test/|idlelib|turtledemo)", *dirs])


def _pack_cpio(root: Path, dest: Path) -> None:
    files = subprocess.run(["find", ".", "-mindepth", "1"], cwd=root, capture_output=True, check=True).stdout
    with dest.open("wb") as out:
        proc = subprocess.run(["cpio", "--quiet", "-o", "-H", "newc", "--owner=0:0"], cwd=root, input=files,
                              stdout=out, stderr=subprocess.PIPE, check=False)
    if proc.returncode != 0:
        raise BuildError(f"cpio failed: {proc.stderr.decode(errors='replace')}")


def cpio_members(path: Path) -> list[str]:
    """The member names of an initramfs made of one or more concatenated newc archives (cpio -t reads only the
    first), in order."""
    names: list[str] = []
    data = path.read_bytes()
    offset = 0
    while offset + 110 <= len(data):
        if data[offset:offset + 4] == b"\0\0\0\0":  # padding between archives
            offset += 4
            continue
        header = data[offset:offset + 110]
        if header[:6] != b"070701":
            raise BuildError(f"{path}: no newc header at offset {offset}")
        file_size, name_size = int(header[54:62], 16), int(header[94:102], 16)
        name_start = offset + 110
        name = data[name_start:name_start + name_size - 1].decode()
        offset = (name_start + name_size + 3) & ~3
        offset = (offset + file_size + 3) & ~3
        if name != "TRAILER!!!":
            names.append(name)
    return names
