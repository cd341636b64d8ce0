"""What `make qemu kernel image` produced: the right versions, matching parts, and the guest's contents."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from vrdma.buildchain import image
from vrdma.harness.vm import Products

pytestmark = pytest.mark.products


def test_qemu_is_the_patched_10_0_build(products: Products) -> None:
    version = subprocess.run([products.qemu["binary_path"], "--version"], capture_output=True, text=True,
                             check=True).stdout
    assert "version 10.0." in version
    assert products.qemu["version"].split(":")[-1].startswith("10.0.")
    assert (Path(products.qemu["source_dir"]) / "subprojects" / "libvhost-user" / "libvhost-user.c").is_file()


def test_kernel_and_headers_name_the_same_release(products: Products) -> None:
    release = products.kernel["release"]
    assert Path(products.kernel["vmlinuz_path"]).name == f"vmlinuz-{release}"
    assert Path(products.kernel["headers_dir"]).name == f"linux-headers-{release}"
    assert (Path(products.kernel["headers_dir"]) / "Module.symvers").is_file()
    assert products.image["kernel_release"] == release


@pytest.fixture(scope="module")
def image_files(products: Products) -> set[str]:
    listing = subprocess.run(["cpio", "-t", "--quiet", "-F", products.image["initrd_path"]],
                             capture_output=True, text=True, check=True).stdout
    return set(listing.split("\n"))


@pytest.mark.parametrize("path", [
    "init", "etc/inittab", "etc/vrdma/rc.sysinit", "usr/sbin/qemu-ga", "usr/bin/ibv_devices",
    "usr/bin/ibv_rc_pingpong", "usr/bin/ib_write_bw", "usr/bin/rping", "usr/bin/ip", "usr/bin/python3",
    "usr/bin/rdma", "etc/libibverbs.d/rxe.driver", "etc/libibverbs.d/vrdma.driver",
    "bin", "sbin", "lib", "lib64",  # merged-/usr links
])
def test_image_has_the_guest_userland(image_files: set[str], path: str) -> None:
    assert path in image_files


def test_image_has_pyverbs_and_precompiled_python(image_files: set[str]) -> None:
    assert any(p.startswith("usr/lib/python3/dist-packages/pyverbs/") for p in image_files)
    # Compiled by the guest's own interpreter, so tagged with its version (trixie: 3.13), not the host's.
    assert any(p.startswith("usr/lib/python3.13/encodings/__pycache__/") and p.endswith(".cpython-313.pyc")
               for p in image_files)


def test_image_has_the_rdma_modules_and_their_dependencies(image_files: set[str], products: Products) -> None:
    release = products.kernel["release"]
    names = {Path(p).name.split(".ko")[0].replace("-", "_") for p in image_files
             if p.startswith(f"usr/lib/modules/{release}/") and ".ko" in p}
    assert set(image.MODULES) <= names
    assert {"ip6_udp_tunnel", "udp_tunnel", "virtio_ring"} <= names  # pulled in through modules.dep
    assert f"usr/lib/modules/{release}/modules.dep.bin" in image_files


def test_image_carries_the_vrdma_driver_built_for_its_kernel(image_files: set[str], products: Products) -> None:
    from vrdma.buildchain.cache import product

    release = products.kernel["release"]
    assert f"usr/lib/modules/{release}/extra/vrdma.ko" in image_files
    driver = product("driver")
    info = subprocess.run(["modinfo", driver["module_path"]], capture_output=True, text=True, check=True).stdout
    assert f"vermagic:       {release} " in info
    assert "alias:          virtio:d0000002Av*" in info  # binds virtio device ID 42


def test_image_carries_libvrdma_for_its_own_libibverbs(image_files: set[str]) -> None:
    from vrdma.buildchain.cache import product

    provider = product("provider")
    library = Path(provider["library_path"])
    assert f"usr/lib/x86_64-linux-gnu/libibverbs/{library.name}" in image_files
    # Same private ABI suffix as Debian's own providers in the image (librxe-rdmav<N>.so) ...
    suffix = library.name.removeprefix("libvrdma")
    assert "usr/lib/x86_64-linux-gnu/libibverbs/librxe" + suffix in image_files
    # ... and the symbols it needs from libibverbs are that private ABI's.
    symbols = subprocess.run(["objdump", "-T", library], capture_output=True, text=True, check=True).stdout
    pabi = suffix.removeprefix("-rdmav").removesuffix(".so")
    assert f"(IBVERBS_PRIVATE_{pabi}) verbs_register_driver_{pabi}" in symbols
    assert Path(provider["driver_file"]).read_text() == "driver vrdma\n"


def test_module_closure_follows_modules_dep(tmp_path: Path) -> None:
    (tmp_path / "modules.dep").write_text(
        "kernel/a.ko: kernel/b.ko kernel/c-d.ko\nkernel/b.ko: kernel/c-d.ko\nkernel/c-d.ko:\nkernel/e.ko:\n")
    assert image.module_closure(tmp_path, ["a"]) == ["kernel/a.ko", "kernel/b.ko", "kernel/c-d.ko"]
    assert image.module_closure(tmp_path, ["c_d"]) == ["kernel/c-d.ko"]
    with pytest.raises(Exception, match=r"not found.*nope"):
        image.module_closure(tmp_path, ["nope"])
