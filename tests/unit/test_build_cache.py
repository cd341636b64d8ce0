"""The content-keyed cache and the product registry."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vrdma.buildchain import cache
from vrdma.errors import MissingProductError


@pytest.fixture()
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("VRDMA_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("VRDMA_ROOT", str(tmp_path / "checkout"))
    return tmp_path


def test_key_depends_on_every_input_and_not_on_order() -> None:
    a = cache.content_key({"x": 1, "y": [1, 2]})
    assert a == cache.content_key({"y": [1, 2], "x": 1})
    assert a != cache.content_key({"x": 2, "y": [1, 2]})
    assert a != cache.content_key({"x": 1, "y": [2, 1]})


def test_product_is_complete_only_after_a_successful_build(isolated: Path) -> None:
    product = cache.CachedProduct("thing", {"v": 1})
    assert not product.complete
    with pytest.raises(RuntimeError), product.building() as scratch:
        (scratch / "half").write_text("x")
        raise RuntimeError("interrupted")
    assert not product.complete and not product.path.exists()
    with product.building() as scratch:
        (scratch / "file").write_text("done")
    assert product.complete
    assert (product.path / "file").read_text() == "done"
    assert json.loads((product.path / ".complete.json").read_text()) == {"v": 1}


def test_same_inputs_same_place_other_inputs_elsewhere(isolated: Path) -> None:
    assert cache.CachedProduct("k", {"a": 1}).path == cache.CachedProduct("k", {"a": 1}).path
    assert cache.CachedProduct("k", {"a": 1}).path != cache.CachedProduct("k", {"a": 2}).path


def test_unrecorded_product_names_the_make_target(isolated: Path) -> None:
    with pytest.raises(MissingProductError, match=r"missing build product 'image'.*make image"):
        cache.product("image")


def test_recorded_product_whose_files_vanished_is_missing(isolated: Path) -> None:
    gone = isolated / "gone.cpio"
    cache.record_product("image", {"initrd_path": str(gone)})
    with pytest.raises(MissingProductError, match=r"initrd_path .*gone.cpio does not exist.*make image"):
        cache.product("image")
    gone.write_text("")
    assert cache.product("image")["initrd_path"] == str(gone)


def test_failed_build_command_reports_command_and_output(tmp_path: Path) -> None:
    from vrdma.errors import BuildError

    with pytest.raises(BuildError, match=r"exit status 3.*sh -c.*\nboom"):
        cache.run(["sh", "-c", "echo boom; exit 3"])
    log = tmp_path / "step.log"
    with pytest.raises(BuildError, match=r"full log: .*step.log"):
        cache.run(["sh", "-c", "echo boom; exit 3"], log_file=log)
    assert "boom" in log.read_text()
