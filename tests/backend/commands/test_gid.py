"""ADD_GID and DEL_GID: the GID table the guest reports and the backend routes by."""

from __future__ import annotations

import pytest
from backend_process import BackendProcess
from command_helpers import GID, Bystander, Vm, refused

from vrdma.device import abi
from vrdma.device.params import DEFAULT_LIMITS
from vrdma.device.status import Status

pytestmark = pytest.mark.backend
ROCE_V2 = abi.const("VRDMA_GID_TYPE_ROCE_V2")


def add(vm: Vm, index: int, gid: bytes, gid_type: int = ROCE_V2) -> object:
    return vm.call("ADD_GID", "vrdma_cmd_add_gid", index=index, type=gid_type, gid=list(gid))


def test_gids_are_added_replaced_and_removed(vm0: Vm, bystander: Bystander, backend: BackendProcess) -> None:
    add(vm0, 0, GID["vm0"])
    add(vm0, 3, bytes(16))
    add(vm0, 3, GID["vm0"][:15] + b"\x09")  # replaces index 3
    assert backend.counters("vm0")["gids"] == {"0": "0000:0000:0000:0000:0000:ffff:a9fe:6401",
                                               "3": "0000:0000:0000:0000:0000:ffff:a9fe:6409"}
    vm0.call("DEL_GID", "vrdma_cmd_del_gid", index=3)
    assert set(backend.counters("vm0")["gids"]) == {"0"}


@pytest.mark.parametrize("case", ["index past the table", "unknown type", "type 0"])
def test_bad_gid_is_refused(vm0: Vm, bystander: Bystander, case: str) -> None:
    index, gid_type, because = {
        "index past the table": (DEFAULT_LIMITS.gid_table_len, ROCE_V2,
                                 rf"GID index {DEFAULT_LIMITS.gid_table_len} \(the table has"),
        "unknown type": (0, 7, r"GID type 7"), "type 0": (0, 0, r"GID type 0")}[case]
    assert refused(lambda: add(vm0, index, GID["vm0"], gid_type), vm0, because) == Status.INVALID


@pytest.mark.parametrize(("fields", "expected", "because"),
                         [({"index": 5}, Status.INVALID, r"GID index 5 is not set"),
                          ({"index": 0, "reserved": 1}, Status.INVALID, r"reserved field of DEL_GID is 1")])
def test_deleting_a_gid_that_is_not_there_is_refused(vm0: Vm, bystander: Bystander, fields: dict[str, int],
                                                      expected: Status, because: str) -> None:
    add(vm0, 0, GID["vm0"])
    assert refused(lambda: vm0.call("DEL_GID", "vrdma_cmd_del_gid", **fields), vm0, because) == expected
