"""The data engine's libFuzzer harness (engine_fuzz.c) and its seed scenarios (seeds.py)."""
