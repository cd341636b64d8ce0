"""Coverage-guided fuzzing of the device-state loader (RdmaDevice.load_state: device/state.py and engine/state.c),
atheris.

Two VMs on one engine, in process (vrdma.testing.inprocess.LocalVms), kept for the whole run. Each input is a
state offered to vm0, reset first: what QEMU's migration stream or a former backend could hand the backend. A state
carries a CRC-32, which a mutated byte almost never keeps right, so the input's first byte says whether the harness
makes it right (bit 0 set) before offering the rest; and a structure-aware mutator (``mutate``) changes one field
of the model's JSON, one byte of the engine's records or of a doorbell page, or the container's lengths, then
re-packs the state, so that mutations reach past the checksum and the JSON parser into every check behind them.

Properties checked on every input:
- a state is refused with StateError only (any other exception is a finding), and a refused state leaves vm0 with
  no objects;
- a state taken runs: vm0 resumed and polled beside vm1, the engine's invariants hold (Engine.check), the model's
  reference counts are not negative and every QP of the model exists in the engine; then vm0, suspended, saves a
  state that loads into it again once reset (what it took, it can give on);
- no file descriptor is left open.

``python -m fuzz.state_fuzz [libFuzzer options] [corpus dirs or files]``; ``python -m fuzz.state_fuzz
--write-seeds DIR`` writes the seeds (states of VMs with traffic in flight).
"""

from __future__ import annotations

import functools
import json
import logging
import random
import zlib
from collections.abc import Callable
from typing import Any

import atheris

from fuzz.atheris_main import Stats, check_no_new_fds, main_or_seeds, open_fds

with atheris.instrument_imports(include=["vrdma.device"]):
    from vrdma.device import abi, state
    from vrdma.device.state import StateError
from vrdma.testing.inprocess import LocalVms, Side

KIB, MIB = 1 << 10, 1 << 20
WRITE, SEND = abi.const("VRDMA_WR_RDMA_WRITE"), abi.const("VRDMA_WR_SEND")
FIX_CRC = 1
POLLS = 4
MEMORY = 16 << 20  # each VM's guest memory

logging.disable(logging.CRITICAL)


class Session:
    """The two VMs every input uses (made once: a LocalVms costs far more than an input)."""

    def __init__(self) -> None:
        self.vms = LocalVms(2, memory_size=MEMORY)
        self.vm0, self.vm1 = self.vms.vms
        self.stats = Stats("states")

    def fresh_vm0(self) -> None:
        self.vm0.device.reset(keep_memory=True)
        self.vm0.device.suspend(False)


@functools.cache
def session() -> Session:
    return Session()


def pack(model: dict[str, Any], engine: bytes, pages: list[tuple[int, bytes]]) -> bytes:
    raw = json.dumps(model, separators=(",", ":")).encode()
    body = raw + engine + b"".join(state.PAGE_INDEX.pack(page) + content for page, content in pages)
    return state.HEADER.pack(state.MAGIC, state.VERSION, len(raw), len(engine), len(pages), zlib.crc32(body)) + body


def with_crc(data: bytes) -> bytes:
    """The state with its checksum made right (its header's other fields as they are)."""
    if len(data) < state.HEADER.size:
        return data
    magic, version, model_len, engine_len, pages, _ = state.HEADER.unpack_from(data)
    body = data[state.HEADER.size:]
    return state.HEADER.pack(magic, version, model_len, engine_len, pages, zlib.crc32(body)) + body


def _check_bookkeeping(s: Session) -> None:
    o = s.vm0.device.objects
    for table in (o.pds, o.cqs, o.srqs, o.xrcds):
        for handle, obj in table.pool.objects.items():
            assert obj.refs >= 0, f"{table.what} {handle:#x} has {obj.refs} references"
    for qp in o.qps.pool.objects.values():
        s.vms.engine.qp_state(s.vm0.dev, qp.slot)  # EngineError if the engine has no such QP


def test_one_input(data: bytes) -> None:
    s = session()
    fds = open_fds()
    offered = with_crc(data[1:]) if data[:1] and data[0] & FIX_CRC else data[1:]
    s.fresh_vm0()
    s.stats.inputs += 1
    try:
        s.vm0.device.load_state(offered)
    except StateError:
        assert not any(s.vm0.device.objects.counts().values()), "a refused state left objects behind"
    else:
        s.vm0.device.suspend(False)
        for _ in range(POLLS):
            s.vms.poll()
        _check_bookkeeping(s)
        s.vm0.device.suspend()
        again = s.vm0.device.save_state()
        s.vm0.device.reset(keep_memory=True)
        s.vm0.device.load_state(again)  # StateError here is a finding: the device refuses what it gave
    s.fresh_vm0()
    check_no_new_fds(fds, "a state")
    s.stats.done()


# -- the structure-aware mutator ------------------------------------------------------------------------------

INTERESTING = (0, 1, 2, 7, 8, 255, 256, 4095, 4096, 65535, 65536, (1 << 24) - 1, 1 << 24, (1 << 31) - 1, 1 << 31,
               (1 << 32) - 1, 1 << 32, (1 << 63) - 1, 1 << 64, -1)


def _leaves(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    if isinstance(value, dict):
        return [leaf for key, item in value.items() for leaf in _leaves(item, (*path, key))] or [path]
    if isinstance(value, list):
        return [leaf for i, item in enumerate(value) for leaf in _leaves(item, (*path, i))] or [path]
    return [path]


def _set(model: Any, path: tuple[Any, ...], value: Any) -> None:
    for key in path[:-1]:
        model = model[key]
    if path:
        model[path[-1]] = value


def _get(model: Any, path: tuple[Any, ...]) -> Any:
    for key in path:
        model = model[key]
    return model


def _new_value(old: Any, rng: random.Random) -> Any:
    if isinstance(old, bool):
        return not old
    if isinstance(old, int):
        return rng.choice([old + 1, old - 1, old ^ (1 << rng.randrange(32)), rng.choice(INTERESTING), "1", None])
    if isinstance(old, str):
        return rng.choice(["", old[:-2], old + "00", "zz" + old[2:], old[::-1], 7])
    return rng.choice([0, "", [], {}, None])


def _mutate_parts(data: bytes, rng: random.Random) -> bytes | None:
    _, _, model_len, engine_len, npages, _ = state.HEADER.unpack_from(data)
    body = data[state.HEADER.size:]
    model = json.loads(body[:model_len])
    engine = bytearray(body[model_len:model_len + engine_len])
    pages = []
    at = model_len + engine_len
    for _ in range(npages):
        pages.append((state.PAGE_INDEX.unpack_from(body, at)[0],
                      body[at + state.PAGE_INDEX.size:at + state.PAGE_INDEX.size + state.DOORBELL_PAGE]))
        at += state.PAGE_INDEX.size + state.DOORBELL_PAGE
    how = rng.randrange(10)
    if how < 5:  # one field of the model
        leaves = _leaves(model)
        path = rng.choice(leaves)
        if rng.randrange(8) == 0 and path:  # or a field dropped, a stray one added
            parent = _get(model, path[:-1])
            if isinstance(parent, dict):
                parent.pop(path[-1]) if rng.randrange(2) else parent.setdefault("extra", 1)
        else:
            _set(model, path, _new_value(_get(model, path), rng))
    elif how < 8 and engine:  # one value of the engine's records (a 4-byte word, where fields are)
        word = rng.randrange(len(engine) // 4)
        value = rng.choice((*INTERESTING, rng.getrandbits(32))) & 0xFFFFFFFF
        engine[word * 4:word * 4 + 4] = value.to_bytes(4, "little")
    elif how < 9 and pages:  # a doorbell page: another index, or a word of its contents
        i = rng.randrange(len(pages))
        page, content = pages[i]
        if rng.randrange(2):
            pages[i] = (rng.choice((0, page + 1, page - 1 & 0xFFFFFFFF, 1 << 20)), content)
        else:
            word = rng.randrange(len(content) // 4)
            pages[i] = (page, content[:word * 4] + rng.getrandbits(32).to_bytes(4, "little") + content[word * 4 + 4:])
    else:  # the engine's part cut or grown
        engine = engine[:rng.randrange(len(engine) + 1)] if rng.randrange(2) else engine + bytes(rng.randrange(64))
    return pack(model, bytes(engine), pages)


def mutate(data: bytes, max_size: int, seed: int) -> bytes:
    """One structured change of a state (then re-packed with a right checksum), or libFuzzer's own mutation of the
    bytes when the input is not a state the mutator can take apart."""
    rng = random.Random(seed)
    mode, rest = (data[0], data[1:]) if data else (FIX_CRC, b"")
    if rng.randrange(4):
        try:
            changed = _mutate_parts(rest, rng)
        except Exception:  # an input the mutator cannot take apart: libFuzzer's mutation instead
            changed = None
        if changed is not None and len(changed) < max_size:
            return bytes([mode | FIX_CRC]) + changed
    return bytes(atheris.Mutate(data, max_size))


# -- seeds ----------------------------------------------------------------------------------------------------

def _pair(vms: LocalVms, mr_size: int) -> tuple[Side, Side]:
    vm0, vm1 = vms.vms
    a, b = vm0.side(mr_size, depth=16, cq_entries=64), vm1.side(mr_size, depth=16, cq_entries=64)
    vms.connect(vm0, a.qp, vm1, b.qp)
    return a, b


def seeds() -> dict[str, bytes]:
    """States of vm0 with idle objects, traffic in flight, an SRQ and an address handle, each saved from two VMs made
    as the harness makes its own (the same names, limits, memory and GIDs), so that they load there."""
    out = {}

    def saved(name: str, scenario: Callable[[LocalVms], None]) -> None:
        with LocalVms(2, memory_size=MEMORY) as vms:
            scenario(vms)
            vms.vms[0].device.suspend()
            out[name] = bytes([FIX_CRC]) + vms.vms[0].device.save_state()

    def idle(vms: LocalVms) -> None:
        _pair(vms, 64 * KIB)

    def in_flight(vms: LocalVms) -> None:
        a, b = _pair(vms, 1 * MIB)
        c, d = _pair(vms, 64 * KIB)
        for i in range(2):
            b.verbs.post_recv(b.qp, [(b.mr.addr + i * KIB, KIB, b.mr.lkey)], wr_id=i)
        a.verbs.post_send(a.qp, WRITE, [(a.mr.addr, MIB, a.mr.lkey)], wr_id=1, remote_addr=b.mr.addr,
                          rkey=b.mr.rkey)
        a.verbs.post_send(a.qp, SEND, [(a.mr.addr, KIB, a.mr.lkey)], wr_id=2)
        d.verbs.post_send(d.qp, WRITE, [(d.mr.addr, 64 * KIB, d.mr.lkey)], wr_id=3, remote_addr=c.mr.addr,
                          rkey=c.mr.rkey)
        vms.poll()

    def srq_and_ah(vms: LocalVms) -> None:
        vm0 = vms.vms[0]
        pd = vm0.verbs.alloc_pd()
        vm0.verbs.create_srq(pd, depth=16, limit=4)
        vm0.verbs.call("VRDMA_CMD_CREATE_AH", "vrdma_cmd_create_ah", "vrdma_resp_create_ah", pd=pd, sgid_index=0,
                       dgid=list(vms.vms[1].gid))
        _pair(vms, 64 * KIB)

    saved("idle", idle)
    saved("in-flight", in_flight)
    saved("srq-and-ah", srq_and_ah)
    return out


if __name__ == "__main__":
    main_or_seeds(test_one_input, seeds, custom_mutator=mutate)
