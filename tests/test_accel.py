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
    assert chosen in ("kvm", "tcg")
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1
    expected = "accelerator: KVM (" if chosen == "kvm" else "accelerator: TCG, because KVM cannot boot a guest"
    assert lines[0].startswith(expected), lines


def test_probe_without_kvm_device_answers_at_once(monkeypatch: pytest.MonkeyPatch, products: Products,
                                                  tmp_path: object) -> None:
    from pathlib import Path

    monkeypatch.setattr(accel, "KVM_DEVICE", Path("/nonexistent/kvm"))
    usable, reason = accel.probe_kvm(products.qemu["binary_path"], list(products.qemu["firmware_dirs"]),
                                     products.kernel["vmlinuz_path"])
    assert not usable and reason == "/nonexistent/kvm does not exist"
