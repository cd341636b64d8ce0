"""CREATE_AH and DESTROY_AH: a destination GID sent from one of the VM's own GIDs."""

from __future__ import annotations

import pytest
from backend_process import BackendProcess
from command_helpers import GID, Bystander, Vm, refused

from vrdma.device.status import Status

pytestmark = pytest.mark.backend


def create(vm: Vm, pd: int, overrides: dict[str, object] | None = None) -> int:
    fields: dict[str, object] = {"pd": pd, "dgid": list(GID["vm1"]), "sgid_index": 0, "hop_limit": 64}
    fields.update(overrides or {})
    return int(vm.call("CREATE_AH", "vrdma_cmd_create_ah", "vrdma_resp_create_ah", **fields).handle)


def test_an_ah_holds_its_pd(vm0: Vm, bystander: Bystander, backend: BackendProcess) -> None:
    vm0.verbs.add_gid(0, GID["vm0"])
    pd = vm0.verbs.alloc_pd()
    ah = create(vm0, pd)
    assert backend.counters("vm0")["objects"]["ah"] == 1
    assert refused(lambda: vm0.call("DEALLOC_PD", "vrdma_cmd_destroy", handle=pd), vm0,
                   r"PD .* is used by 1 objects") == Status.BUSY
    vm0.call("DESTROY_AH", "vrdma_cmd_destroy", handle=ah)
    vm0.call("DEALLOC_PD", "vrdma_cmd_destroy", handle=pd)
    assert refused(lambda: vm0.call("DESTROY_AH", "vrdma_cmd_destroy", handle=ah), vm0,
                   r"DESTROY_AH: no AH") == Status.INVALID


@pytest.mark.parametrize("case", ["source GID not set", "reserved bytes", "PD never issued"])
def test_bad_ah_is_refused(vm0: Vm, bystander: Bystander, case: str) -> None:
    vm0.verbs.add_gid(0, GID["vm0"])
    pd = vm0.verbs.alloc_pd()
    overrides = {"source GID not set": {"sgid_index": 5}, "reserved bytes": {"reserved": [0, 0, 1, 0, 0]},
                 "PD never issued": {"pd": 0x7777}}[case]
    because = {"source GID not set": r"source GID index 5 is not set", "reserved bytes": r"reserved bytes",
               "PD never issued": r"no PD 0x7777"}[case]
    assert refused(lambda: create(vm0, pd, overrides), vm0, because) == Status.INVALID
