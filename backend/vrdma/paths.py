"""Where vrdma keeps its checkout-relative files, its cache and its run state.

- the cache (``VRDMA_CACHE``, default ``~/.cache/vrdma``) holds build products keyed by their inputs, so a
  fresh clone on a machine that built them before reuses them;
- ``build/`` in the checkout records which cached products this checkout uses (``build/products.json``);
- the run directory (``VRDMA_RUN_DIR``, default ``run/`` in the checkout) holds the state of guests started by
  ``vrdma vm up``: not under ``build/``, so that `make clean` never pulls it from under running guests.
"""

from __future__ import annotations

import os
from pathlib import Path


def project_root() -> Path:
    """The checkout this package was installed from (editable install: backend/vrdma/ lies inside it)."""
    env = os.environ.get("VRDMA_ROOT")
    if env:
        return Path(env).resolve()
    return Path(__file__).resolve().parents[2]


def cache_dir() -> Path:
    env = os.environ.get("VRDMA_CACHE")
    return Path(env).resolve() if env else Path.home() / ".cache" / "vrdma"


def build_dir() -> Path:
    return project_root() / "build"


def products_file() -> Path:
    return build_dir() / "products.json"


def run_dir() -> Path:
    env = os.environ.get("VRDMA_RUN_DIR")
    return Path(env).resolve() if env else project_root() / "run"


def qemu_configs_dir() -> Path:
    return project_root() / "qemu-configs"
