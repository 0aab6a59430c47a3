"""What the agent asks of its journal, whichever store holds it.

`agent.journal.Journal` (one SQLite file, every write fsynced) and
`agent.memory_journal.MemoryJournal` (the simulator's, and tests') both
implement `AgentJournal`, and both apply the rules of `agent.journal_rules`;
the agent is handed one (`agent.app.AgentParts.open_journal`) and cannot tell
which. The SQLite one sends its commits to its connection's thread; the memory one never
leaves the event loop, which is what a virtual-time loop needs.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Protocol

from agent.journal_rules import CommandStore


@dataclass(frozen=True)
class StoredSpec:
    generation: int
    spec_hash: str
    body: bytes
    signature: bytes | None
    key_id: str
    full_spec: bytes  # the NodeSpec in force (a patch body is applied before it is stored)


@dataclass(frozen=True)
class JournalEvent:
    seq: int
    type: str
    event_class: int
    payload: bytes


class JournalCorrupt(Exception):
    pass


class JournalFull(Exception):
    """Results and transitions fill the journal: nothing was written; new commands get BUSY until acks drain it."""


def new_journal_id(rng: random.Random) -> str:
    """A journal's id, drawn from the agent's Random: unique, not secret (the server only compares it)."""
    return f"j-{rng.getrandbits(64):016x}"


class AgentJournal(CommandStore, Protocol):
    """The whole journal: meta, the spec in force, unacked events, batch leaves, and the commands."""

    journal_id: str

    async def close(self) -> None: ...

    # -- meta
    async def get_meta(self, key: str, default: str = "") -> str: ...

    async def set_meta(self, key: str, value: str) -> None: ...

    async def int_meta(self, key: str) -> int: ...

    async def advance_time_mark(self, server_time_ms: int) -> int:
        """The mark only moves forward; returns the mark now in force."""

    async def set_observed(self, generation: int) -> None: ...

    # -- the spec in force
    async def store_spec(self, spec: StoredSpec) -> None:
        """The spec and the applied generation move together."""

    async def load_spec(self) -> StoredSpec | None: ...

    # -- events
    async def append_events(self, items: list[tuple[str, int, bytes]]) -> list[JournalEvent]:
        """(type, class, payload) with the next sequence numbers, within the bounds, else `JournalFull`."""

    async def is_full(self) -> bool: ...

    async def event_stats(self) -> tuple[int, int]:
        """(events held, their payload bytes): what is not yet acked, for the telemetry gauges."""

    async def unacked_events(self, limit: int = 500) -> list[JournalEvent]: ...

    async def ack_events(self, upto_seq: int) -> int: ...

    # -- exec tickets
    async def use_ticket(self, jti: str, exp_ms: int, now_ms: int) -> str:
        """Record exec ticket `jti` as used, durably, unless `agent.journal_tickets.admit` refuses it:
        returns '' or the refusal's code (`replayed`, `jti-set-full`)."""
        ...

    # -- destructive batches
    async def claim_batch_leaf(self, scope_root: str, leaf_index: int, command_id: str, now: float) -> str:
        """Claim a batch leaf for a command; returns the command that holds it, maybe another."""
