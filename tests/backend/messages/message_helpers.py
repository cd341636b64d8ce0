"""What the per-message tests share: a raw message that must cost its sender the connection, and the check that
it cost nothing else."""

from __future__ import annotations

import os
from collections.abc import Callable

import backend_process
from backend_process import BackendProcess, query_device

from vrdma.device.status import Status
from vrdma.testing.frontend import Frontend
from vrdma.vhost_user import protocol

Attack = Callable[[Frontend], None]


def expect_closed(fe: Frontend) -> None:
    backend_process.expect_closed(fe, timeout=5)


def raw(request: int, payload: bytes = b"", flags: int = protocol.VERSION, size: int | None = None,
        fds: int = 0) -> Attack:
    """Send one message as given (``size`` overrides the header's payload size; ``fds`` pipes ride along): the
    backend must drop the connection."""
    def attack(fe: Frontend) -> None:
        pipes = [os.pipe() for _ in range(fds)]
        fe.send_raw(request, payload, flags=flags, size=size, fds=[r for r, _ in pipes])
        for r, w in pipes:
            os.close(r)
            os.close(w)
        expect_closed(fe)
    return attack


def harms_only_its_sender(backend: BackendProcess, attack: Attack) -> None:
    """Run ``attack`` on a new vm0 connection: the backend stays up, and once it has let go of that connection,
    vm0 is served again from a clean state. (The ``bystander`` fixture checks vm1.)"""
    closed = backend.connection("vm0")["closed"]
    with backend.frontend("vm0") as attacker:
        attack(attacker)
    assert backend.proc.poll() is None, backend.log_text()
    backend.wait_for_closed("vm0", closed + 1)
    with backend.frontend("vm0") as again:
        again.start()
        assert query_device(again).hdr.status == Status.OK
