"""Black-box campaign against a real `vrdma backend` process: one attacker VM, one victim VM, batches of hostile
input on every interface the attacker has, and the victim's view checked after every batch.

The process serves vm0 (the attacker) and vm1 (the victim), both played by the simulated frontend
(vrdma.testing.frontend: a real socket, memfd guest memory, split virtqueues) and the simulated driver and
provider (vrdma.testing.simulated_guest). Each batch, the attacker sends:

- work requests (the data engine's interface): bursts of send WQEs, mostly well formed but with any opcode, flag,
  SGE count, local key and address, remote key and address (the victim's MR keys among them, the victim's
  memory as the target), inline lengths, onto QPs connected to the victim's QP and to itself, plus receives and
  producer indices that are sometimes garbage;
- control commands (the device model's interface): valid commands built on its live objects and the victim's
  handles, mutated (bytes flipped, fields replaced with edge values, cut short, lengthened, wrong opcodes, short
  response buffers);
- vhost-user messages (the protocol layer's and libvhost-user's interface): benign requests, memory tables that
  move or shrink its RAM, fd-carrying messages (memfds, eventfds), and malformed ones that end its connection;
  the attacker then connects again, as QEMU would.

After every batch: the process is alive; the victim completes a QUERY_DEVICE within a deadline (a hang shows
here); the victim's registered memory that the attacker may not write (an MR with remote read only, an MR with
no remote access) and an unregistered canary area still hash to what they held; the process's open fds and RSS
stay within bounds of their values after warm-up; after each of the attacker's connections, the backend frees
everything it owned. A failure saves a reproducer (the campaign's seed, the batch, the attacker's recorded
inputs since its last connection, the backend log) under fuzz/crashes/campaign/ and exits non-zero; the same
seed replays the same choices (``--seed``).

``python -m fuzz.campaign --inputs 100000`` (``--help`` for the options). fuzz.run runs it for `make fuzz`.
"""


from fuzz.campaign.common import GID, CampaignFailure, Peer
from fuzz.campaign.process import Backend
from fuzz.campaign.runner import Result, main, run
from fuzz.campaign.victim import Victim

__all__ = ["GID", "Backend", "CampaignFailure", "Peer", "Result", "Victim", "main", "run"]
