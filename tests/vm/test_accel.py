"""Accelerator choice: KVM where it boots a guest, TCG otherwise, with one log line saying which."""

from __future__ import annotations

import logging

import pytest

from vrdma.harness import accel
from vrdma.harness.vm import Products

pytestmark = pytest.mark.products


def _choose(requested: str, products: Products) -> str:
    return accel.choose(requested, products.qemu["binary_path"], list(products.qemu["firmware_dirs"]),
                        products.kernel["vmlinuz_path"])


def test_explicit_choice_is_honoured(products: Products, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="vrdma.harness.accel"):
        assert _choose("tcg", products) == "tcg"
    assert [r.getMessage() for r in caplog.records] == ["accelerator: tcg (requested)"]


def test_auto_picks_one_and_says_why_in_one_line(products: Products, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="vrdma.harness.accel"):
        chosen = _choose("auto", products)
    import json

    from vrdma import paths

    verdict = json.loads((paths.cache_dir() / "accel-probe.json").read_text())  # what the probe found
    assert chosen == ("kvm" if verdict["usable"] else "tcg")
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and verdict["reason"] in lines[0], lines


@pytest.mark.parametrize(("usable", "chosen"), [(True, "kvm"), (False, "tcg")])
def test_auto_follows_the_probe_and_probes_once_per_boot(monkeypatch: pytest.MonkeyPatch, tmp_path: object,
                                                         usable: bool, chosen: str) -> None:
    probes: list[str] = []

    def probe(qemu: str, firmware: list[str], kernel: str) -> tuple[bool, str]:
        probes.append(qemu)
        return usable, f"probe said {usable}"

    monkeypatch.setenv("VRDMA_CACHE", str(tmp_path))
    monkeypatch.setattr(accel, "probe_kvm", probe)
    assert accel.choose("auto", "qemu", [], "vmlinuz") == chosen
    assert accel.choose("auto", "qemu", [], "vmlinuz") == chosen  # from the cache: no second probe
    assert probes == ["qemu"]
    assert accel.choose("auto", "other-qemu", [], "vmlinuz") == chosen and len(probes) == 2  # new key: probed


def test_probe_without_kvm_device_answers_at_once(monkeypatch: pytest.MonkeyPatch, products: Products,
                                                  tmp_path: object) -> None:
    from pathlib import Path

    monkeypatch.setattr(accel, "KVM_DEVICE", Path("/nonexistent/kvm"))
    usable, reason = accel.probe_kvm(products.qemu["binary_path"], list(products.qemu["firmware_dirs"]),
                                     products.kernel["vmlinuz_path"])
    assert not usable and reason == "/nonexistent/kvm does not exist"
