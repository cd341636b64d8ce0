"""The project's own lint rules, the ones ruff, mypy and import-linter cannot state (`make lint` runs them):

- ``length``: no source file is longer than 650 lines (a room that grows past it is two rooms);
- ``opcodes``: no C outside the wire opcode table (backend/vrdma/engine/wire.[ch]) compares an opcode with a
  number or builds one from numbers: an opcode has a name and a row;
- ``layers``: the data engine's C files are layered as pyproject.toml's ``[tool.vrdma.engine-layers]`` declares,
  checked from their object files' symbols: a file calls only files of the layers below its own, so that a
  circle between rooms fails the build.

``python -m vrdma.lint [--only length|opcodes|layers]``: each rule's findings, and a non-zero exit if any.
"""
