"""The build chain: QEMU from Debian's trixie source, the Debian guest kernel, the guest image.

Each product is built once per set of inputs into the cache and recorded in ``build/products.json``.
"""
