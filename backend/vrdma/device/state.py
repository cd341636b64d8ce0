"""A device's state as data: what a live migration or a backend upgrade carries of one VM (docs/migration.md).

The model's side (its object tables, identity, pending events, counters) as a JSON document, the engine's side as
the engine writes it (engine/state.c), and the doorbell pages in use, in one container with a version and a
checksum. A state comes from outside the process (QEMU's migration stream, a former backend), so loading is checked
like any input: every field named, typed and bounded; every reference between objects resolved; every derived value
(reference counts, a context's free doorbell slots, the free doorbell pages) computed, never taken from the state;
the engine's records held to the model's objects; and a refusal (StateError, saying why) leaves the device reset.
"""

from __future__ import annotations

import dataclasses
import json
import struct
import zlib
from collections.abc import Callable
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, TypeVar

from vrdma.device import abi, qp_states
from vrdma.device.ah import Ah
from vrdma.device.cq import Cq
from vrdma.device.gid import GID_TYPES, Gid
from vrdma.device.mr import Mr
from vrdma.device.objects import DeviceObjects
from vrdma.device.pd import Pd
from vrdma.device.qp import STORED, TYPES, Qp
from vrdma.device.srq import Srq
from vrdma.device.status import CommandFailed
from vrdma.device.table import ObjectTable
from vrdma.device.ucontext import (
    DB_SLOT_ALIVE,
    DB_SLOTS,
    FIRST_USER_PAGE,
    KERNEL,
    KERNEL_PAGE,
    UserContext,
    page_indexes,
)
from vrdma.device.xrcd import Xrcd
from vrdma.engine.api import NO_SRQ, DataEngine

if TYPE_CHECKING:
    from vrdma.device.device import RdmaDevice

MAGIC = b"VRDMAST\0"
VERSION = 1
# magic, version, the model's JSON bytes, the engine's state bytes, doorbell pages, CRC-32 of everything after it
HEADER = struct.Struct("<8sIIIII")
DOORBELL_PAGE = abi.const("VRDMA_DOORBELL_PAGE_SIZE")
PAGE_INDEX = struct.Struct("<I")
MAX_MODEL_BYTES = 64 << 20
U64 = (1 << 64) - 1
U32 = (1 << 32) - 1
T = TypeVar("T")


class StateError(ValueError):
    """A state refused: what is wrong with it."""


class Fields:
    """One JSON object of a state, read with the discipline of the command decoder: exactly the keys expected, each
    of the type and range asked for."""

    def __init__(self, value: object, where: str, keys: tuple[str, ...]) -> None:
        if not isinstance(value, dict) or set(value) != set(keys):
            got = sorted(value) if isinstance(value, dict) else type(value).__name__
            raise StateError(f"{where}: expected the fields {sorted(keys)}, got {got}")
        self.value: dict[str, object] = value
        self.where = where

    def integer(self, key: str, low: int = 0, high: int = U32) -> int:
        value = self.value[key]
        if type(value) is not int or not low <= value <= high:
            raise StateError(f"{self.where}.{key}: {value!r} is not an integer in [{low}, {high}]")
        return value

    def flag(self, key: str) -> bool:
        value = self.value[key]
        if type(value) is not bool:
            raise StateError(f"{self.where}.{key}: {value!r} is not true or false")
        return value

    def raw(self, key: str, size: int) -> bytes:
        value = self.value[key]
        try:
            data = bytes.fromhex(value) if isinstance(value, str) else None
        except ValueError:
            data = None
        if data is None or len(data) != size:
            raise StateError(f"{self.where}.{key}: not {size} bytes in hex")
        return data

    def items(self, key: str, most: int) -> list[object]:
        value = self.value[key]
        if not isinstance(value, list) or len(value) > most:
            raise StateError(f"{self.where}.{key}: not a list of at most {most}")
        return value

    def integers(self, key: str, most: int, low: int = 0, high: int = U32) -> list[int]:
        values = self.items(key, most)
        if any(type(v) is not int or not low <= v <= high for v in values):
            raise StateError(f"{self.where}.{key}: not integers in [{low}, {high}]")
        return [int(v) for v in values]  # type: ignore[call-overload]

    def obj(self, key: str, keys: tuple[str, ...]) -> Fields:
        return Fields(self.value[key], f"{self.where}.{key}", keys)


# -- saving -------------------------------------------------------------------------------------------------------

def _table(table: ObjectTable[T], fields: Callable[[T], dict[str, object]]) -> dict[str, object]:
    return {"generations": table.pool.generations(),
            "objects": [[handle, fields(obj)] for handle, obj in sorted(table.pool.objects.items())]}


def _model(device: RdmaDevice) -> dict[str, object]:
    o = device.objects
    qp_attr = {**{name: 0 for names in STORED.values() for name in names}, "dgid": ""}

    def qp_fields(qp: Qp) -> dict[str, object]:
        attr = {**qp_attr, **{k: (v.hex() if k == "dgid" else v) for k, v in qp.attr.items() if k != "qp_state"}}
        return {"ucontext": qp.ucontext, "pd": qp.pd, "qpn": qp.qpn, "send_cq": qp.send_cq, "recv_cq": qp.recv_cq,
                "srq": qp.srq, "caps": dict(qp.caps), "dbs": list(qp.dbs), "attr": attr, "qp_type": qp.qp_type,
                "xrcd": qp.xrcd}

    return {
        "name": device.name, "mac": device.mac.hex(), "epoch": device.epoch, "pairing_id": device.pairing_id,
        "node_guid": device.identity.node_guid, "limits": dataclasses.asdict(device.limits),
        "doorbell_recheck": device.doorbell_recheck, "qos_carried": dict(device.qos_carried),
        "commands": device.command_counters.commands, "command_errors": device.command_counters.command_errors,
        "events_posted": device.event_counters.events_posted,
        "events_dropped": device.event_counters.events_dropped, "events": [e.hex() for e in device.events],
        "gids": [[index, gid.raw.hex(), gid.type] for index, gid in sorted(o.gids.entries.items())],
        "kernel_pages": list(o.ucontexts.kernel.pages),
        "ucontexts": _table(o.ucontexts, lambda c: {"pages": list(c.pages)}),
        "pds": _table(o.pds, lambda pd: {"ucontext": pd.ucontext}),
        "mrs": _table(o.mrs, lambda mr: {k: v for k, v in dataclasses.asdict(mr).items() if k != "slot"}),
        "cqs": _table(o.cqs, lambda cq: {"ucontext": cq.ucontext, "entries": cq.entries, "db": cq.db}),
        "xrcds": _table(o.xrcds, lambda x: {}),
        "srqs": _table(o.srqs, lambda s: {"ucontext": s.ucontext, "pd": s.pd, "depth": s.depth, "max_sge": s.max_sge,
                                          "db": s.db, "xrcd": s.xrcd, "cq": s.cq, "srqn": s.srqn}),
        "qps": _table(o.qps, qp_fields),
        "ahs": _table(o.ahs, lambda ah: {"pd": ah.pd, "sgid_index": ah.sgid_index, "dgid": ah.dgid.hex()}),
        "qpn_generation": o.qps.numbers.generation, "srqn_generation": o.srqs.numbers.generation,
    }


def save(device: RdmaDevice) -> bytes:
    """The device's state; its engine side must be suspended (Engine.suspend_device), and nothing changes."""
    engine_state = device.seat.engine.save_device(device.engine_index)
    model = json.dumps(_model(device), separators=(",", ":")).encode()
    pages = sorted({*device.objects.ucontexts.kernel.pages, *device.objects.ucontexts.doorbell_pages_held()})
    doorbells = b"".join(PAGE_INDEX.pack(page) + bytes(device.doorbells[page * DOORBELL_PAGE:(page + 1) *
                                                                           DOORBELL_PAGE]) for page in pages)
    body = model + engine_state + doorbells
    return HEADER.pack(MAGIC, VERSION, len(model), len(engine_state), len(pages), zlib.crc32(body)) + body


# -- loading ------------------------------------------------------------------------------------------------------

MODEL_KEYS = ("name", "mac", "epoch", "pairing_id", "node_guid", "limits", "doorbell_recheck", "qos_carried",
              "commands", "command_errors", "events_posted", "events_dropped", "events", "gids", "kernel_pages",
              "ucontexts", "pds", "mrs", "cqs", "xrcds", "srqs", "qps", "ahs", "qpn_generation", "srqn_generation")


def _objects(f: Fields, key: str, table: ObjectTable[T], keys: tuple[str, ...],
             make: Callable[[int, Fields], T]) -> dict[int, T]:
    """A saved table's objects, made by ``make(handle, fields)`` and restored into ``table``'s pool."""
    saved = f.obj(key, ("generations", "objects"))
    generations = saved.integers("generations", table.pool.limit)
    objects: dict[int, T] = {}
    for i, entry in enumerate(saved.items("objects", table.pool.limit)):
        if not isinstance(entry, list) or len(entry) != 2 or type(entry[0]) is not int:
            raise StateError(f"{f.where}.{key}.objects[{i}]: not a [handle, fields] pair")
        handle = entry[0]
        if handle in objects:
            raise StateError(f"{f.where}.{key}: handle {handle:#x} twice")
        objects[handle] = make(handle, Fields(entry[1], f"{f.where}.{key}[{handle:#x}]", keys))
    try:
        table.pool.restore(generations, objects)
    except ValueError as err:
        raise StateError(f"{f.where}.{key}: {err}") from err
    for handle, obj in objects.items():
        if hasattr(obj, "slot"):
            setattr(obj, "slot", table.pool.slot(handle))  # noqa: B010 - the kinds with an engine side
    return objects


def _never_set(name: str, attr: dict[str, Any]) -> bool:
    """Whether a QP's attribute holds the zero MODIFY_QP stores for what was never given, rather than a value: a
    port (the GSI QP gets none), a path MTU (UD QPs), an address vector (no destination GID with it)."""
    if name == "AV":
        return "dgid" not in attr
    return name in ("PORT", "PATH_MTU") and attr[STORED[name][0]] == 0


class Loader:
    """One state loaded into a reset device's fresh object tables."""

    def __init__(self, device: RdmaDevice, model: Fields) -> None:
        self.device = device
        self.f = model
        self.o = DeviceObjects(device.name, device.seat, device.limits, device.identity, lambda page, alive: None,
                               device.fabric.route)
        self.used_dbs: dict[int, set[int]] = {}  # per context handle: the doorbell indexes its queues hold

    def ref(self, table: ObjectTable[T], handle: int, what: str) -> T:
        obj = table.pool.get(handle)
        if obj is None:
            raise StateError(f"{what} names {table.what} {handle:#x}, which the state does not have")
        return obj

    def context(self, handle: int, what: str) -> UserContext:
        return self.o.ucontexts.kernel if handle == KERNEL else self.ref(self.o.ucontexts, handle, what)

    def take_dbs(self, ctx_handle: int, dbs: list[int], what: str) -> None:
        ctx = self.context(ctx_handle, what)
        pages = set(ctx.pages)
        held = self.used_dbs.setdefault(ctx_handle, set())
        for db in dbs:
            # (a queue's slots: all but the page's first, parked, and its alive slot and past: page_indexes)
            if db // DB_SLOTS not in pages or not 0 < db % DB_SLOTS < DB_SLOT_ALIVE or db in held:
                raise StateError(f"{what}: doorbell {db} is not a free slot of its context's pages")
            held.add(db)
        ctx.queues += 1

    def contexts(self) -> None:
        f, o = self.f, self.o
        pages_of_all = range(FIRST_USER_PAGE, self.device.limits.doorbell_pages)
        kernel_pages = f.integers("kernel_pages", len(pages_of_all) + 1, 0, self.device.limits.doorbell_pages - 1)
        if not kernel_pages or kernel_pages[0] != KERNEL_PAGE or any(p not in pages_of_all for p in kernel_pages[1:]):
            raise StateError("model.kernel_pages: the kernel's doorbell page first, then pages of the region")
        contexts = _objects(f, "ucontexts", o.ucontexts, ("pages",), lambda h, c: UserContext(
            c.integers("pages", len(pages_of_all), FIRST_USER_PAGE, self.device.limits.doorbell_pages - 1)))
        taken = list(kernel_pages[1:]) + [page for ctx in contexts.values() for page in ctx.pages]
        if len(set(taken)) != len(taken) or any(not ctx.pages for ctx in contexts.values()):
            raise StateError("model: a doorbell page held twice, or a context without one")
        o.ucontexts.kernel.pages = list(kernel_pages)
        o.ucontexts._free_pages = sorted(set(pages_of_all) - set(taken))  # a sorted list is a heap

    def gids(self) -> None:
        entries = self.f.items("gids", self.device.limits.gid_table_len)
        for i, entry in enumerate(entries):
            if not isinstance(entry, list) or len(entry) != 3 or type(entry[0]) is not int or \
                    not 0 <= entry[0] < self.device.limits.gid_table_len or entry[2] not in GID_TYPES or \
                    entry[0] in self.o.gids.entries:
                raise StateError(f"model.gids[{i}]: not an [index, GID, type] of the table")
            raw = Fields({"gid": entry[1]}, f"model.gids[{i}]", ("gid",)).raw("gid", 16)
            self.o.gids.entries[entry[0]] = Gid(raw, int(entry[2]))

    def pds(self) -> None:
        for handle, pd in _objects(self.f, "pds", self.o.pds, ("ucontext",),
                                   lambda h, p: Pd(p.integer("ucontext"))).items():
            ctx = self.context(pd.ucontext, f"PD {handle:#x}")
            if ctx is not self.o.ucontexts.kernel:
                ctx.pds.add(handle)

    def mrs(self) -> None:
        limits = self.device.limits
        keys = ("pd", "lkey", "rkey", "access", "iova", "length", "max_pages", "mw_type", "page_offset")
        for handle, mr in _objects(self.f, "mrs", self.o.mrs, keys, lambda h, m: Mr(
                m.integer("pd"), 0, m.integer("lkey"), m.integer("rkey"),
                m.integer("access", 0, abi.const("VRDMA_ALL_ACCESS")), m.integer("iova", 0, U64),
                m.integer("length", 0, limits.max_mr_size),
                m.integer("max_pages", 0, limits.max_fast_reg_pages), m.integer("mw_type", 0, 2),
                m.integer("page_offset", 0, 4095))).items():
            self.ref(self.o.pds, mr.pd, f"MR {handle:#x}").refs += 1

    def cqs(self) -> None:
        for handle, cq in _objects(self.f, "cqs", self.o.cqs, ("ucontext", "entries", "db"), lambda h, c: Cq(
                c.integer("ucontext"), 0, c.integer("entries", 1, self.device.limits.max_cqe),
                c.integer("db"))).items():
            self.take_dbs(cq.ucontext, [cq.db], f"CQ {handle:#x}")

    def srqs(self) -> None:
        keys = ("ucontext", "pd", "depth", "max_sge", "db", "xrcd", "cq", "srqn")
        for handle, srq in _objects(self.f, "srqs", self.o.srqs, keys, lambda h, s: Srq(
                s.integer("ucontext"), s.integer("pd"), 0, s.integer("depth", 1, self.device.limits.max_srq_wr),
                s.integer("max_sge", 0, self.device.limits.max_srq_sge), s.integer("db"), 0, s.integer("xrcd"),
                s.integer("cq"), s.integer("srqn", 0, (1 << 24) - 1))).items():
            what = f"SRQ {handle:#x}"
            self.ref(self.o.pds, srq.pd, what).refs += 1
            if srq.xrcd:
                self.ref(self.o.xrcds, srq.xrcd, what).refs += 1
                self.ref(self.o.cqs, srq.cq, what).refs += 1
            self.take_dbs(srq.ucontext, [srq.db], what)

    def qps(self) -> None:
        keys = ("ucontext", "pd", "qpn", "send_cq", "recv_cq", "srq", "caps", "dbs", "attr", "qp_type", "xrcd")
        attr_keys = (*(name for names in STORED.values() for name in names), "dgid")

        def make(handle: int, q: Fields) -> Qp:
            caps = q.obj("caps", ("max_send_wr", "max_recv_wr", "max_send_sge", "max_recv_sge", "max_inline_data"))
            attr = q.obj("attr", attr_keys)
            stored: dict[str, Any] = {name: attr.integer(name) for name in attr_keys if name != "dgid"}
            if attr.value["dgid"] != "":
                stored["dgid"] = attr.raw("dgid", 16)
            qp_type = q.integer("qp_type", 0, 255)
            if qp_type not in TYPES:
                raise StateError(f"QP {handle:#x}: type {qp_type}")
            return Qp(q.integer("ucontext"), q.integer("pd"), 0, q.integer("qpn", 0, (1 << 24) - 1),
                      q.integer("send_cq"), q.integer("recv_cq"), q.integer("srq"),
                      {k: caps.integer(k) for k in caps.value},
                      q.integers("dbs", 2), {**stored, "qp_state": qp_states.RESET}, qp_type, q.integer("xrcd"))

        for handle, qp in _objects(self.f, "qps", self.o.qps, keys, make).items():
            what = f"QP {handle:#x}"
            present = {name for name, names in STORED.items() if all(n in qp.attr for n in names)
                       and not _never_set(name, qp.attr)}
            try:  # the ranges MODIFY_QP checks, on every attribute the state has
                self.o.qps._check_attributes(qp, present.__contains__, SimpleNamespace(**qp.attr))
            except CommandFailed as err:
                raise StateError(f"{what}: {err}") from err
            refs: list[tuple[ObjectTable[Any], int]] = [(self.o.pds, qp.pd), (self.o.cqs, qp.send_cq),
                                                        (self.o.cqs, qp.recv_cq), (self.o.srqs, qp.srq),
                                                        (self.o.xrcds, qp.xrcd)]
            for table, ref in refs:
                if ref:
                    self.ref(table, ref, what).refs += 1
            if qp.dbs:
                self.take_dbs(qp.ucontext, qp.dbs, what)
            else:
                self.context(qp.ucontext, what).queues += 1

    def ahs(self) -> None:
        for handle, ah in _objects(self.f, "ahs", self.o.ahs, ("pd", "sgid_index", "dgid"), lambda h, a: Ah(
                a.integer("pd"), a.integer("sgid_index"), a.raw("dgid", 16))).items():
            self.ref(self.o.pds, ah.pd, f"AH {handle:#x}").refs += 1
            if ah.sgid_index not in self.o.gids:
                raise StateError(f"AH {handle:#x}: source GID index {ah.sgid_index} is not set")

    def free_dbs(self) -> None:
        """Each context's free doorbell slots: those of its pages no queue holds (the order a fresh page gives)."""
        for handle, ctx in [(KERNEL, self.o.ucontexts.kernel), *self.o.ucontexts.pool.objects.items()]:
            held = self.used_dbs.get(handle, set())
            ctx.free_dbs = [db for page in reversed(ctx.pages) for db in page_indexes(page) if db not in held]

    def run(self) -> DeviceObjects:
        self.contexts()
        self.gids()
        self.pds()
        self.mrs()
        self.cqs()
        _objects(self.f, "xrcds", self.o.xrcds, (), lambda h, x: Xrcd())
        self.srqs()
        self.qps()
        self.ahs()
        self.free_dbs()
        try:
            self.o.qps.numbers.restore(self.f.integer("qpn_generation"))
            self.o.srqs.numbers.restore(self.f.integer("srqn_generation"))
        except ValueError as err:
            raise StateError(f"model: {err}") from err
        return self.o


def split(data: bytes) -> tuple[Fields, bytes, list[tuple[int, bytes]]]:
    """A state's three parts, its container checked: the model (parsed JSON), the engine's bytes, doorbell pages."""
    if len(data) < HEADER.size:
        raise StateError(f"a state of {len(data)} bytes has no header")
    magic, version, model_len, engine_len, npages, crc = HEADER.unpack_from(data)
    if magic != MAGIC or version != VERSION:
        raise StateError(f"not a vrdma device state of version {VERSION} (magic {magic!r}, version {version})")
    body = memoryview(data)[HEADER.size:]
    if model_len > MAX_MODEL_BYTES or len(body) != model_len + engine_len + npages * (PAGE_INDEX.size +
                                                                                      DOORBELL_PAGE):
        raise StateError(f"a state of {len(body)} bytes after its header, not the {model_len} + {engine_len} + "
                         f"{npages} pages it says")
    if zlib.crc32(body) != crc:
        raise StateError("the state's checksum does not match its contents")
    try:
        model = json.loads(bytes(body[:model_len]))
    except ValueError as err:
        raise StateError(f"the model's part is not JSON: {err}") from err
    at = model_len + engine_len
    pages = []
    for _ in range(npages):
        page = PAGE_INDEX.unpack_from(body, at)[0]
        pages.append((page, bytes(body[at + PAGE_INDEX.size:at + PAGE_INDEX.size + DOORBELL_PAGE])))
        at += PAGE_INDEX.size + DOORBELL_PAGE
    return Fields(model, "model", MODEL_KEYS), bytes(body[model_len:model_len + engine_len]), pages


KEY_CONSUMER = abi.const("VRDMA_KEY_CONSUMER_MASK")  # a key's low byte: the consumer's (fast registration, binds)


def _cross_check(o: DeviceObjects, engine: DataEngine, engine_state: bytes) -> None:
    """The engine's records and the model's objects describe the same objects: one record per MR, CQ, SRQ and QP,
    in its slot, with the handle, numbers, references and doorbells the model gave it."""
    tables: dict[str, ObjectTable[Any]] = {"mr": o.mrs, "cq": o.cqs, "srq": o.srqs, "qp": o.qps}
    by_slot = {kind: {obj.slot: (handle, obj) for handle, obj in table.pool.objects.items()}
               for kind, table in tables.items()}
    seen: set[tuple[str, int]] = set()
    for kind, slot, c in engine.state_objects(engine_state):
        found = by_slot[kind].get(slot)
        if found is None or c["handle"] != found[0] or (kind, slot) in seen:
            raise StateError(f"the engine's {tables[kind].what} in slot {slot} is not the model's")
        seen.add((kind, slot))
        handle, obj = found
        if kind == "mr":
            same = (c["pd"], c["mw_type"], c["max_pages"]) == (obj.pd, obj.mw_type, obj.max_pages) and \
                not (c["rkey"] ^ obj.rkey) & ~KEY_CONSUMER and \
                (obj.mw_type or not (c["lkey"] ^ obj.lkey) & ~KEY_CONSUMER)
        elif kind == "cq":
            same = (c["entries"], c["db"]) == (obj.entries, obj.db)
        elif kind == "srq":
            cq_slot = o.cqs.get(obj.cq).slot if obj.xrcd else 0
            same = (c["pd"], c["depth"], c["max_sge"], c["db"], c["xrcd"], c["cq"], c["srqn"]) == \
                (obj.pd, obj.depth, obj.max_sge, obj.db, obj.xrcd, cq_slot, obj.srqn)
        else:
            send = o.cqs.get(obj.send_cq).slot if obj.send_cq else 0
            recv = o.cqs.get(obj.recv_cq).slot if obj.recv_cq else 0
            srq = o.srqs.get(obj.srq).slot if obj.srq else NO_SRQ
            dbs = list(obj.dbs) + [0] * (2 - len(obj.dbs))
            same = (c["qpn"], c["pd"], c["send_cq"], c["recv_cq"], c["srq"], c["sq_db"], c["rq_db"], c["xrcd"]) == \
                (obj.qpn, obj.pd, send, recv, srq, dbs[0], dbs[1], obj.xrcd) and \
                c["flags"] & TYPES[obj.qp_type][1] == TYPES[obj.qp_type][1]
        if not same:
            raise StateError(f"the engine's {tables[kind].what} {handle:#x} does not match the model's")
    missing = [(tables[kind].what, slot) for kind, slots in by_slot.items() for slot in slots
               if (kind, slot) not in seen]
    if missing:
        raise StateError(f"the engine's state lacks the model's {missing[0][0]} in slot {missing[0][1]}")


def _identity(device: RdmaDevice, f: Fields) -> None:
    """The state is this device's: the same VM (name, MAC) with the same limits."""
    if f.value["name"] != device.name or f.raw("mac", 6) != device.mac:
        raise StateError(f"the state is of VM {f.value['name']!r} (MAC {f.value['mac']}), not of {device.name!r}")
    if f.value["limits"] != dataclasses.asdict(device.limits):
        raise StateError("the state was saved under other device limits than this device's")


@dataclasses.dataclass
class Checked:
    """A state checked against a device: everything load() applies, each value read and bounded already."""

    objects: DeviceObjects
    engine_state: bytes
    pages: list[tuple[int, bytes]]
    epoch: int
    pairing_id: int
    node_guid: int
    events: list[bytes]
    counters: dict[str, int]
    qos_carried: dict[str, int]
    doorbell_recheck: bool


def check(device: RdmaDevice, data: bytes) -> Checked:
    """The state checked against this device without changing it (a destination's check before it knows the guest's
    memory): its model's object tables built aside, every other value read. StateError saying what is wrong."""
    f, engine_state, pages = split(data)
    _identity(device, f)
    for page, _ in pages:
        if not 0 < page < device.limits.doorbell_pages:
            raise StateError(f"doorbell page {page} is not a page of the region")
    objects = Loader(device, f).run()
    held = {*objects.ucontexts.kernel.pages, *objects.ucontexts.doorbell_pages_held()}
    if sorted(page for page, _ in pages) != sorted(held):
        raise StateError("the doorbell pages of the state are not the pages its contexts hold")
    try:
        device.seat.engine.load_device(device.engine_index, engine_state, check_only=True)
    except Exception as err:  # EngineError: the engine's reason
        raise StateError(f"the engine's state: {err}") from err
    _cross_check(objects, device.seat.engine, engine_state)
    events = [Fields({"event": event}, f"model.events[{i}]", ("event",)).raw("event", abi.sizeof("vrdma_event"))
              for i, event in enumerate(f.items("events", device.limits.max_pending_events))]
    carried = f.obj("qos_carried", tuple(device.qos_carried))
    return Checked(objects, engine_state, pages, f.integer("epoch", 1, U64), f.integer("pairing_id", 0, U64),
                   f.integer("node_guid", 0, U64), events,
                   {name: f.integer(name, 0, U64) for name in ("commands", "command_errors", "events_posted",
                                                               "events_dropped")},
                   {name: carried.integer(name, 0, U64) for name in device.qos_carried},
                   f.flag("doorbell_recheck"))


def load(device: RdmaDevice, data: bytes, live_doorbells: bool = False, checked: Checked | None = None) -> None:
    """The state becomes the device's: checked whole as check() does, then applied: its doorbell pages, its engine
    side (whose pages must translate through the device's memory table now), its GIDs, objects, identity, events
    and counters. The device must be fresh from a reset (nothing of a guest's yet); it stays suspended in the
    engine until resumed. On a refusal (StateError) it is as it was, or reset again if the engine refused.
    ``checked``: what check() made of these bytes for this device, fresh then as now."""
    if any(device.objects.counts().values()) or device.events:
        raise StateError(f"{device.name}: a state loads into a device fresh from a reset")
    if checked is None:
        checked = check(device, data)
    engine, dev = device.seat.engine, device.engine_index
    if not live_doorbells:  # (a backend upgrade's: the guest kept ringing while the state travelled)
        device.clear_doorbell_pages()
        for page, content in checked.pages:
            device.doorbells[page * DOORBELL_PAGE:(page + 1) * DOORBELL_PAGE] = content
    objects = checked.objects
    try:
        for index, gid in objects.gids.entries.items():
            engine.set_gid(dev, index, gid.raw, gid.type)  # (another device of the engine may hold the GID)
        engine.load_device(dev, checked.engine_state)
    except Exception as err:  # EngineError: a page the destination's memory table does not have, say
        device.reset(keep_memory=True)
        raise StateError(f"the engine refused the state: {err}") from err
    objects.ucontexts.set_alive = device.set_alive
    device.objects = objects
    device.epoch, device.pairing_id = checked.epoch, checked.pairing_id
    header = device.doorbell_header()  # the region's page 0 names the identity the guest saw, as config space does
    device.doorbells[:len(header)] = header
    device.identity = dataclasses.replace(device.identity, node_guid=checked.node_guid)
    objects.identity = device.identity
    device.events.extend(checked.events)
    device.command_counters.commands = checked.counters["commands"]
    device.command_counters.command_errors = checked.counters["command_errors"]
    device.event_counters.events_posted = checked.counters["events_posted"]
    device.event_counters.events_dropped = checked.counters["events_dropped"]
    device.qos_carried = checked.qos_carried
    device.doorbell_recheck = checked.doorbell_recheck
