"""What `make qemu kernel image` produced: the right versions, matching parts, and the guest's contents."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from vrdma.buildchain import image
from vrdma.buildchain.kernel import DEFAULT_KERNEL, GUEST_KERNELS
from vrdma.harness.vm import Products

pytestmark = pytest.mark.products


def test_qemu_is_the_patched_10_0_build(products: Products) -> None:
    version = subprocess.run([products.qemu["binary_path"], "--version"], capture_output=True, text=True,
                             check=True).stdout
    assert "version 10.0." in version
    assert products.qemu["version"].split(":")[-1].startswith("10.0.")
    assert (Path(products.qemu["source_dir"]) / "subprojects" / "libvhost-user" / "libvhost-user.c").is_file()


@pytest.fixture(scope="module", params=list(GUEST_KERNELS))
def kernel_products(request: pytest.FixtureRequest) -> Products:
    """The products of each guest kernel (`make image` builds them all)."""
    return Products.load(request.param)


def test_the_default_kernel_is_recorded_under_the_bare_names(products: Products) -> None:
    assert products == Products.load(DEFAULT_KERNEL)


def test_kernel_and_headers_name_the_same_release(kernel_products: Products) -> None:
    kernel = kernel_products.kernel
    release = kernel["release"]
    assert kernel["name"] in GUEST_KERNELS
    # /boot/vmlinuz-<release> until 6.x, /usr/lib/modules/<release>/vmlinuz from 7.x
    assert Path(kernel["vmlinuz_path"]).name in (f"vmlinuz-{release}", "vmlinuz")
    assert Path(kernel["headers_dir"]).name == f"linux-headers-{release}"
    assert (Path(kernel["headers_dir"]) / "Module.symvers").is_file()
    assert kernel_products.image["kernel_release"] == release
    # Built with its own release's compiler: the host's for bookworm, a build root of its release otherwise.
    assert ("build_root_dir" in kernel) == (GUEST_KERNELS[kernel["name"]].suite is not None)


def test_the_kernels_are_6_1_to_the_newest(products: Products) -> None:
    releases = {name: Products.load(name).kernel["release"] for name in GUEST_KERNELS}
    assert releases["bookworm"].startswith("6.1.") and releases["trixie"].startswith("6.12.")
    newest = tuple(int(n) for n in releases["trixie-backports"].split(".")[:2])
    assert newest > (6, 12), releases


@pytest.fixture(scope="module")
def image_files(kernel_products: Products) -> set[str]:
    return set(image.cpio_members(Path(kernel_products.image["initrd_path"])))


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


def test_image_has_the_rdma_modules_and_their_dependencies(image_files: set[str],
                                                           kernel_products: Products) -> None:
    release = kernel_products.kernel["release"]
    names = {Path(p).name.split(".ko")[0].replace("-", "_") for p in image_files
             if p.startswith(f"usr/lib/modules/{release}/") and ".ko" in p}
    builtin = {Path(p).name.split(".ko")[0].replace("-", "_") for p in
               (Path(kernel_products.kernel["modules_dir"]) / "modules.builtin").read_text().split()}
    assert set(image.MODULES) <= names | builtin
    assert {"ib_core", "rdma_rxe", "nvme_rdma", "ib_isert"} <= names
    assert {"ip6_udp_tunnel", "udp_tunnel"} <= names  # pulled in through modules.dep
    assert f"usr/lib/modules/{release}/modules.dep.bin" in image_files


def test_the_modules_archive_leaves_the_merged_usr_links_alone(kernel_products: Products) -> None:
    """The image is the root filesystem's archive, then the kernel's modules' one: an entry of the second
    named like a link of the first (lib, bin) would replace the link with a directory."""
    members = image.cpio_members(Path(kernel_products.image["initrd_path"]))
    assert all(members.count(link) == 1 for link in ("bin", "sbin", "lib", "lib64")), members[-20:]


def test_image_carries_the_vrdma_driver_built_for_its_kernel(image_files: set[str],
                                                             kernel_products: Products) -> None:
    from vrdma.buildchain.kernel import kernel_product

    release = kernel_products.kernel["release"]
    assert f"usr/lib/modules/{release}/extra/vrdma.ko" in image_files
    driver = kernel_product("driver", kernel_products.kernel["name"])
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
