"""Fuzzers at vrdma's trust boundaries, a black-box campaign against the backend process, and the sanitizer build.

See fuzz/README.md. Not part of the installed package: run from the checkout (``python -m fuzz.run``).
"""
