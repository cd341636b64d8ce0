"""The checked WRITE stream (guest/write_stream.py) between two guests of a cluster, driven from the host: started,
asked how far it got, and ended with both sides' reports. Used by the migration tests and `vrdma bench --only
migration`; the guests it names are looked up in the cluster at each step, since a migration gives a guest a new
QEMU (and a new Vm)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from vrdma.errors import VrdmaError
from vrdma.harness import verbs

PROGRAM = (Path(__file__).parent / "guest" / "write_stream.py").read_text()
PORT = 18516
PROGRESS = "/tmp/write-stream.blocks"  # in the receiving guest: the blocks checked so far
FLOWING_WITHIN = 120.0  # seconds for its set-up (pyverbs under TCG takes seconds) or for a step of its progress
ENDED_WITHIN = 120.0


class StreamFailed(VrdmaError):
    """The stream did not start, did not move on, or a side did not end well: what both guests said."""


class WriteStream:
    """``sender`` writes blocks of ``block`` bytes into ``receiver`` (guest names of ``cluster``) until end()."""

    def __init__(self, cluster: Any, receiver: str, sender: str, gid: int, *, device: str = "vrdma0",
                 block: int = 64 << 10, port: int = PORT) -> None:
        self.cluster, self.receiver_name, self.sender_name = cluster, receiver, sender
        self.receiver_argv = ["python3", "-c", PROGRAM, "recv", device, str(gid), str(port), "0", str(block),
                              PROGRESS]
        self.receiver_pid = self.receiver.agent.spawn(self.receiver_argv)
        verbs.wait_listening(self.receiver, port, timeout=60, server_pid=self.receiver_pid)
        self.sender_argv = ["python3", "-c", PROGRAM, "send", device, str(gid), self.receiver.address, str(port),
                            "0", str(block)]
        self.sender_pid = self.sender.agent.spawn(self.sender_argv)
        self.wait_for(64, "the WRITE stream flowing")

    @property
    def receiver(self) -> Any:
        return self.cluster[self.receiver_name]

    @property
    def sender(self) -> Any:
        return self.cluster[self.sender_name]

    def blocks(self) -> int:
        """The blocks the receiver has checked so far (-1: it has not begun)."""
        text = self.receiver.run(["cat", PROGRESS]).stdout.strip()
        return int(text) if text.isdigit() else -1

    def wait_for(self, more: int, what: str = "the WRITE stream moving on") -> None:
        """Until the receiver has checked ``more`` blocks beyond what it had (the file is asked for: nothing
        announces it)."""
        target = max(self.blocks(), 0) + more
        deadline = time.monotonic() + FLOWING_WITHIN
        while self.blocks() < target:
            if time.monotonic() > deadline:
                raise StreamFailed(f"{what}: not within {FLOWING_WITHIN:g} s (at {self.blocks()} of {target} "
                                   f"blocks)")
            time.sleep(0.2)

    def running(self) -> bool:
        return self.receiver.agent.poll(self.receiver_pid) is None and \
            self.sender.agent.poll(self.sender_pid) is None

    def end(self) -> dict[str, dict[str, Any]]:
        """SIGTERM to the sender, which ends the stream once its blocks are acknowledged; both sides' reports
        (``send``, ``recv``), each of which exited 0. A side that does not end, or ends in error, raises
        StreamFailed with what the guests say."""
        sender, receiver = self.sender, self.receiver
        sender.run(["kill", "-TERM", str(self.sender_pid)]).check("the WRITE stream told to end")
        reports = {}
        for name, guest, pid, argv in (("send", sender, self.sender_pid, self.sender_argv),
                                       ("recv", receiver, self.receiver_pid, self.receiver_argv)):
            try:
                result = guest.agent.wait(pid, argv, timeout=ENDED_WITHIN)
            except Exception as err:
                state = {vm.name: vm.run(["sh", "-c", "ss -tn; for p in $(pgrep python3); do grep State "
                                          "/proc/$p/status; cat /proc/$p/wchan; echo; done"]).stdout
                         for vm in (sender, receiver)}
                raise StreamFailed(f"the WRITE stream's {name} side did not end ({err}): {state}") from None
            if result.exit_status != 0:
                raise StreamFailed(f"the WRITE stream's {name} side in {guest.name} failed: "
                                   f"{result.stdout[-3000:]}{result.stderr[-3000:]}")
            reports[name] = json.loads(result.stdout)
        return reports
