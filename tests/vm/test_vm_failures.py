"""Failures name their cause: a guest kernel panic, a command past its timeout, a missing build product."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from vrdma.errors import MissingProductError
from vrdma.harness.cluster import Cluster
from vrdma.harness.errors import CommandTimeout, GuestPanicError
from vrdma.harness.vm import Products

pytestmark = pytest.mark.vm


def test_guest_panic_is_reported_with_console_log(products: Products, tmp_path: Path) -> None:
    # No init in the initramfs and no root device: the kernel panics at the end of its boot.
    with pytest.raises(GuestPanicError) as caught, \
            Cluster(1, tmp_path, products=products, append_extra={0: "rdinit=/no-such-init"}):
        pytest.fail("a guest without init must not become ready")
    err = caught.value
    message = str(err)
    assert "guest vm0: kernel panic: Kernel panic - not syncing" in message
    assert "QEMU command line: " in message and "-kernel" in message
    assert "QEMU exit status: 0" in message  # panic=-1 reboots, -no-reboot turns that into QEMU exiting
    assert err.console_log is not None and err.console_log.is_file()
    assert "Kernel panic" in err.console_log.read_text(errors="replace")
    assert "Kernel panic" in err.console_tail


def test_command_past_its_timeout_is_killed_and_reported(two_guests_for_failures: Cluster) -> None:
    vm = two_guests_for_failures[0]
    start = time.monotonic()
    with pytest.raises(CommandTimeout) as caught:
        vm.run(["sh", "-c", "sleep 300 & sleep 301; echo never"], timeout=3)
    assert time.monotonic() - start < 60
    assert str(caught.value).startswith("command timed out in vm0 after 3 s and was killed: sh -c")
    assert "console log: " in str(caught.value)
    # The command and its children are gone.
    assert vm.sh("pidof sleep || echo none").stdout.strip() == "none"


@pytest.fixture(scope="module")
def two_guests_for_failures(two_guests: Cluster) -> Cluster:
    return two_guests


def test_missing_build_product_names_the_product_and_make_target(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch,
                                                                  products: Products) -> None:
    checkout = tmp_path / "checkout"
    (checkout / "build").mkdir(parents=True)
    recorded = {"qemu": dict(products.qemu), "kernel": dict(products.kernel)}  # no image
    (checkout / "build" / "products.json").write_text(json.dumps(recorded))
    monkeypatch.setenv("VRDMA_ROOT", str(checkout))
    with pytest.raises(MissingProductError, match=r"missing build product 'image'.*run `make image`"):
        Products.load()
    recorded["image"] = {"initrd_path": str(tmp_path / "deleted.cpio")}
    (checkout / "build" / "products.json").write_text(json.dumps(recorded))
    with pytest.raises(MissingProductError, match=r"initrd_path .*deleted.cpio does not exist"), \
            Cluster(1, tmp_path / "run"):
        pass
