"""The engine's GID index (gid.c): the one table connections, packets and datagrams are routed by.

Driven through the engine's API with many devices and GIDs, checked against a plain model of what routing must
answer (the lowest open device holding the GID), through additions, replacements, removals and device closes in a
random order: removal from an open-addressed table is where a hash index goes wrong.
"""

from __future__ import annotations

import ctypes
import random

import pytest

from vrdma.device.params import DEFAULT_LIMITS, engine_limits
from vrdma.engine.api import MAX_GIDS, NO_DEVICE
from vrdma.engine.native import Engine, EngineError

DEVICES = 8


@pytest.fixture
def engine() -> tuple[Engine, ctypes.Array[ctypes.c_char]]:
    doorbells = ctypes.create_string_buffer(DEFAULT_LIMITS.doorbell_pages * 4096)
    e = Engine(DEVICES)
    for dev in range(DEVICES):
        e.open_device(dev, engine_limits(DEFAULT_LIMITS), ctypes.addressof(doorbells))
    return e, doorbells  # the doorbell region lives as long as the engine in the test


def gid(n: int) -> bytes:
    """GIDs that differ in few bits (IPv4-mapped addresses in one subnet): neighbours in any weak hash."""
    return bytes(10) + b"\xff\xff" + bytes([10, 0, n >> 8 & 0xff, n & 0xff])


def test_routes_to_the_device_holding_the_gid_and_forgets_removed_ones(engine: tuple[Engine, object]) -> None:
    e, _ = engine
    e.set_gid(3, 0, gid(1), 2)
    e.set_gid(5, 7, gid(2), 1)
    assert (e.route_gid(gid(1)), e.route_gid(gid(2)), e.route_gid(gid(3))) == (3, 5, NO_DEVICE)
    e.set_gid(3, 0, gid(4), 2)  # replaced: the old GID routes nowhere
    assert (e.route_gid(gid(1)), e.route_gid(gid(4))) == (NO_DEVICE, 3)
    e.set_gid(5, 7, bytes(16), 0)
    assert e.route_gid(gid(2)) == NO_DEVICE
    e.close_device(3)
    assert e.route_gid(gid(4)) == NO_DEVICE


def test_a_gid_two_devices_hold_routes_to_the_lower_one(engine: tuple[Engine, object]) -> None:
    e, _ = engine
    e.set_gid(6, 1, gid(9), 2)
    e.set_gid(2, 4, gid(9), 2)
    assert e.route_gid(gid(9)) == 2
    e.close_device(2)
    assert e.route_gid(gid(9)) == 6


def test_a_gid_of_a_closed_device_cannot_be_set(engine: tuple[Engine, object]) -> None:
    e, _ = engine
    e.close_device(1)
    with pytest.raises(EngineError):
        e.set_gid(1, 0, gid(1), 2)
    assert e.route_gid(gid(1)) == NO_DEVICE


def test_random_changes_keep_the_index_equal_to_a_plain_table(engine: tuple[Engine, object]) -> None:
    e, _ = engine
    rng = random.Random(25)
    table: dict[tuple[int, int], bytes] = {}
    open_devices = set(range(DEVICES))
    for step in range(20000):
        dev, index = rng.randrange(DEVICES), rng.randrange(MAX_GIDS)
        action = rng.random()
        if action < 0.002 and dev in open_devices:
            e.close_device(dev)
            open_devices.discard(dev)
            table = {key: raw for key, raw in table.items() if key[0] != dev}
        elif dev not in open_devices:
            continue
        elif action < 0.6:
            raw = gid(rng.randrange(300))  # few distinct GIDs: duplicates across devices are common
            e.set_gid(dev, index, raw, 2)
            table[dev, index] = raw
        else:
            e.set_gid(dev, index, bytes(16), 0)
            table.pop((dev, index), None)
        if step % 97 == 0:
            for n in range(300):
                holders = [d for (d, _), raw in table.items() if raw == gid(n)]
                assert e.route_gid(gid(n)) == (min(holders) if holders else NO_DEVICE), (step, n)
