"""The data engine: the device's hot loop in C (engine.h), and the typed interface the device model uses.

``vrdma.engine.api`` is that interface (pure Python: importing it needs no build); ``vrdma.engine.native`` is the
C engine through cffi, built by `make backend`. This package's own import loads neither.
"""
