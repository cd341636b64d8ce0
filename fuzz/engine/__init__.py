"""The data engine's libFuzzer harness (engine_fuzz.c, with its fake VMs in vm.c and its object operations in
objects.c) and its seed scenarios (seeds.py)."""
