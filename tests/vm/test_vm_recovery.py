"""Device reset and recovery (issue 10, finding 6): the backend killed and restarted while two guests hold contexts,
QPs and traffic. The guests must not be left with a device that silently lost its state: programs see the error and
end, the driver reports the device fatal, and vrdma0 comes back without a reboot."""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterator

import pytest
from polling import wait_until

from vrdma.harness import verbs
from vrdma.harness.cluster import Cluster
from vrdma.harness.daemon import vm_counters
from vrdma.harness.vm import Products, Vm

pytestmark = pytest.mark.vm
log = logging.getLogger(__name__)

DEVICE = "vrdma0"
ASYNC_LOG = "/tmp/vrdma-async-events.log"


@pytest.fixture(scope="module")
def guests(products: Products, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with Cluster(2, tmp_path_factory.mktemp("recovery"), products=products) as cluster:
        yield cluster


def port_active(vm: Vm) -> bool:
    result = vm.run(["ibv_devinfo", "-d", DEVICE], timeout=30)
    return result.exit_status == 0 and "PORT_ACTIVE" in result.stdout


def test_backend_restart_under_traffic_fails_programs_and_brings_vrdma0_back(guests: Cluster) -> None:
    server, client = guests[0], guests[1]
    backend = guests.backend
    assert backend is not None
    gid = verbs.ipv4_gid_index(server, DEVICE)
    argv = ["ibv_rc_pingpong", "-d", DEVICE, "-g", str(gid), "-s", "4096", "-n", "100000000"]
    watcher = server.agent.spawn(["sh", "-c", f"exec ibv_asyncwatch -d {DEVICE} > {ASYNC_LOG} 2>&1"])
    server_pid = server.agent.spawn(argv)
    verbs.wait_listening(server, verbs.PINGPONG_PORT, timeout=60, server_pid=server_pid)
    client_pid = client.agent.spawn([*argv, server.address])
    sent = vm_counters(backend, "vm1")["engine"]["send_wqes"]
    wait_until("ping-pong traffic through the backend",
               lambda: vm_counters(backend, "vm1")["engine"]["send_wqes"] > sent + 200, 120)

    backend.kill()
    backend.start()
    restarted = time.monotonic()

    # Both programs end, with an error, instead of waiting for completions that will never come.
    server_result = server.agent.wait(server_pid, argv, timeout=120)
    client_result = client.agent.wait(client_pid, argv, timeout=120)
    ended = time.monotonic() - restarted
    for name, result in (("server", server_result), ("client", client_result)):
        assert result.exit_status != 0, f"{name} exited 0 after the device lost its state:\n{result.stdout}"
        assert "Failed status" in result.stderr + result.stdout or "Couldn't" in result.stderr + result.stdout, \
            f"{name}: {result.stdout}{result.stderr}"

    # vrdma0 is back in both guests, without a reboot.
    usable = max(wait_until(f"{vm.name}: {DEVICE} PORT_ACTIVE again", lambda vm=vm: port_active(vm), 120)
                 for vm in (server, client))
    usable = time.monotonic() - restarted
    for vm in (server, client):
        dmesg = vm.run(["dmesg"]).check("dmesg").stdout
        assert "device lost: the device's state was reset" in dmesg, dmesg[-3000:]
        assert "device recovered in" in dmesg, dmesg[-3000:]
    # The driver reported the device fatal to the programs that held it.
    server.agent.kill(watcher)
    events = server.run(["cat", ASYNC_LOG]).check("async events").stdout
    assert "IBV_EVENT_DEVICE_FATAL" in events or "event_type 8" in events, events
    log.info("backend restart: programs ended %.1f s, %s usable again %.1f s after the new backend was ready",
             ended, DEVICE, usable)

    # New contexts, QPs and traffic work.
    gid = verbs.ipv4_gid_index(server, DEVICE)
    result = verbs.rc_pingpong(server, client, DEVICE, gid, iterations=1000, extra=("-c",))
    assert result.iterations == 1000
    counters = vm_counters(backend, "vm0")
    assert counters["objects"]["qp"] == verbs.MAD_OBJECTS["qp"] and counters["objects"]["ucontext"] == 0


def test_device_loss_flushes_the_kernel_consumers_work(guests: Cluster) -> None:
    """A kernel RDMA user with receives outstanding when the backend restarts: the driver resets the lost device and
    completes them (and a send posted after the loss) with IB_WC_WR_FLUSH_ERR, so the user ends and lets go of the
    device instead of waiting for completions that will never come; vrdma0 then comes back."""
    vm = guests[0]
    backend = guests.backend
    assert backend is not None
    vm.run(["dmesg", "-c"]).check("dmesg -c")
    argv = ["modprobe", "vrdma_kverbs_test", "messages=16", "size=4096", "await_loss=120"]
    module = vm.agent.spawn(argv)
    wait_until("the module waiting with its receives posted",
               lambda: "waiting for the device to be lost" in vm.run(["dmesg"]).check("dmesg").stdout, 120)

    backend.kill()
    backend.start()
    restarted = time.monotonic()

    loaded = vm.agent.wait(module, argv, timeout=150)
    dmesg = vm.run(["dmesg"]).check("dmesg").stdout
    assert loaded.exit_status == 0, f"{loaded.stdout}{loaded.stderr}\n{dmesg[-4000:]}"
    assert re.search(r"vrdma0: device lost: 16 receives and a send posted after it completed flushed "
                     r"\(IB_WC_WR_FLUSH_ERR\) in \d+ ms", dmesg), dmesg[-4000:]
    vm.run(["rmmod", "vrdma_kverbs_test"]).check("rmmod vrdma_kverbs_test")
    wait_until(f"{vm.name}: {DEVICE} PORT_ACTIVE again", lambda: port_active(vm), 120)
    assert "WARNING" not in vm.run(["dmesg"]).check("dmesg").stdout  # no failed drain or other kernel warning
    # QEMU resumed the restarted backend where the queues' used rings were, moments after the driver's last
    # commands: no request popped twice (which once read a freed indirect table and aborted QEMU).
    assert "invalid address for buffers" not in backend.log_text()
    assert "closing the device" not in backend.log_text()
    log.info("kernel consumer's work flushed and vrdma0 usable again %.1f s after the new backend was ready",
             time.monotonic() - restarted)

    # The kernel's data path works on the recovered device.
    vm.run(["modprobe", "vrdma_kverbs_test", "messages=8"]).check("vrdma_kverbs_test after recovery")
    vm.run(["rmmod", "vrdma_kverbs_test"]).check("rmmod vrdma_kverbs_test")
