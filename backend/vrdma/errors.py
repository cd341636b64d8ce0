"""The one exception root of the vrdma package and its specific subclasses.

Every error carries the values a person needs to act on it; the CLI maps them to exit codes in one place.
"""

from __future__ import annotations


class VrdmaError(Exception):
    """Root of every error vrdma raises on purpose."""


class BuildError(VrdmaError):
    """A step of the build chain (deps, qemu, kernel, image) failed."""


class MissingProductError(VrdmaError):
    """A build product the harness needs has not been built (or was removed from the cache)."""

    def __init__(self, product: str, detail: str) -> None:
        self.product = product
        kind, _, kernel = product.partition("/")  # per guest kernel: image/trixie
        make = f"make {kind} GUEST_KERNELS={kernel}" if kernel else f"make {kind}"
        super().__init__(f"missing build product '{product}': {detail}; run `{make}` to build it")
