"""The handle pool: slots with generations, bounded memory whatever the churn, keys that name their slot."""

from __future__ import annotations

import tracemalloc

import pytest

from vrdma.device import abi
from vrdma.device import pool as pool_module
from vrdma.device.pool import RESERVED_KEY, FreeSlots, Pool


def test_handle_pools_stay_bounded_however_many_objects_come_and_go() -> None:
    """A guest that creates and destroys objects in a loop must not grow the backend: a table's memory is bounded by
    its limit (it once remembered every handle ever issued), and a stale handle still finds nothing."""
    table: Pool[int] = Pool("mr", 1024)
    held = [table.add(i) for i in range(512)]
    stale = table.add(-1)
    table.remove(stale)
    tracemalloc.start()
    try:
        for i in range(10_000):  # warm-up: the dict reaches its working size
            table.remove(table.add(i))
        warm, _ = tracemalloc.get_traced_memory()
        for i in range(50_000):
            table.remove(table.add(i))
        grown = tracemalloc.get_traced_memory()[0] - warm
    finally:
        tracemalloc.stop()
    assert grown < 4 << 10, f"{grown} bytes kept by 50,000 more create/destroy pairs"
    assert table.get(stale) is None and len(table) == len(held)
    assert all(table.get(handle) == i for i, handle in enumerate(held))
    assert len({table.add(i) for i in range(512)} | set(held)) == 1024 and table.full()


def test_keys_carry_the_slot_above_their_low_byte_and_differ_around_it() -> None:
    pool: Pool[str] = Pool("mr", 4096)
    handle = pool.add("mr")
    slot = pool.slot(handle)
    keys = {pool.key(slot) for _ in range(64)}
    assert all((key >> 8) & 4095 == slot for key in keys) and len(keys) > 60
    assert len({key & 0xFF for key in keys}) > 16 and len({key >> 20 for key in keys}) > 16
    lkey = pool.key(slot)
    assert pool.key(slot, avoid=lkey) != lkey


def test_no_key_is_the_local_dma_lkey(monkeypatch: pytest.MonkeyPatch) -> None:
    """Slot 0 with random bits 0 would be key 0, the local DMA lkey (it names guest RAM in the kernel's work
    requests, never an MR): the pool draws again."""
    draws = iter([0, 0, 5, 7])  # (high bits, low byte) of each try
    monkeypatch.setattr(pool_module.secrets, "randbits", lambda bits: next(draws))
    pool: Pool[str] = Pool("mr", 4096)
    assert RESERVED_KEY == abi.const("VRDMA_LOCAL_DMA_LKEY") == 0
    assert pool.key(0) == 5 << 20 | 7


def test_free_slots_come_back_lowest_first_only_once_given() -> None:
    slots = FreeSlots(5, first=1)
    taken = [slots.take() for _ in range(4)]
    assert taken == [1, 2, 3, 4] and slots.take() is None
    slots.give(3)
    assert slots.take() == 3
