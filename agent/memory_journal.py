"""The journal in memory: for the simulator, the property tests and an agent on a virtual-time loop.

It is a whole `AgentJournal` (meta, the spec in force, unacked events, batch
leaves, commands) and applies the same rules as the SQLite journal
(`agent.journal_rules`: duplicates, recovery, sweep, event bounds, sizes), so
a scenario that holds here holds on disk. It never leaves the event loop (no
thread, no file), which is what lets a hundred agents share one virtual-time
loop. "Durable" means surviving a simulated crash: the simulator keeps the
`MemoryJournal` and replaces the process around it, which is exactly what a
restart does to the file. Nothing here is lost with a process; what a crash
loses is the work in flight, not the journal.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace

from agent import journal_rules as rules
from agent import journal_tickets as jti_rules
from agent.journal_api import JournalEvent, JournalFull, StoredSpec
from agent.journal_rules import MAX_BYTES, MAX_EVENTS, CommandEntry, EventRow, Settlement
from bc.protocol.limits import LIMITS, Limits


class MemoryJournal:
    def __init__(
        self, journal_id: str = "j-memory", *, max_events: int = MAX_EVENTS, max_bytes: int = MAX_BYTES
    ) -> None:
        """`journal_id`: `journal_api.new_journal_id(rng)` for an agent; the bounds as in `Journal.open`."""
        self.journal_id = journal_id
        self.max_events, self.max_bytes = rules.clamp_bounds(max_events, max_bytes)
        self._entries: dict[str, CommandEntry] = {}
        self._bodies: dict[str, bytes] = {}
        self._meta: dict[str, str] = {}
        self._spec: StoredSpec | None = None
        self._events: dict[int, JournalEvent] = {}  # unacked, by seq (insertion order is seq order)
        self._leaves: dict[tuple[str, int], str] = {}
        self._tickets: dict[str, int] = {}  # used exec tickets: jti -> exp_ms
        self.limits: Limits = LIMITS

    async def close(self) -> None:
        """Nothing to release: the simulator keeps this object across a simulated restart."""

    # -- meta ----------------------------------------------------------
    async def get_meta(self, key: str, default: str = "") -> str:
        return self._meta.get(key, default)

    async def set_meta(self, key: str, value: str) -> None:
        self._meta[key] = value

    async def int_meta(self, key: str) -> int:
        return int(self._meta.get(key, "0") or 0)

    async def advance_time_mark(self, server_time_ms: int) -> int:
        mark = await self.int_meta("server_time_mark_ms")
        if server_time_ms > mark:
            self._meta["server_time_mark_ms"] = str(server_time_ms)
            return server_time_ms
        return mark

    async def set_observed(self, generation: int) -> None:
        self._meta["observed_generation"] = str(generation)

    async def use_ticket(self, jti: str, exp_ms: int, now_ms: int) -> str:
        verdict = jti_rules.admit(self._tickets, jti, exp_ms, now_ms)
        for j in verdict.forget:
            del self._tickets[j]
        if not verdict.refused:
            self._tickets[jti] = exp_ms
        return verdict.refused

    async def claim_batch_leaf(self, scope_root: str, leaf_index: int, command_id: str, now: float) -> str:
        return self._leaves.setdefault((scope_root, leaf_index), command_id)

    # -- spec ----------------------------------------------------------
    async def store_spec(self, spec: StoredSpec) -> None:
        self._spec = spec
        self._meta["applied_generation"] = str(spec.generation)

    async def load_spec(self) -> StoredSpec | None:
        return self._spec

    # -- events --------------------------------------------------------
    async def append_events(self, items: list[tuple[str, int, bytes]]) -> list[JournalEvent]:
        if not items:
            return []
        items = [rules.fit_event(t, c, p, self.limits) for t, c, p in items]
        incoming = [EventRow(0, cls, len(payload)) for _, cls, payload in items]
        plan = rules.plan_bounds(self._event_rows(), incoming, self.max_events, self.max_bytes)
        if not plan.admit:
            raise JournalFull(
                f"the journal holds {len(self._events)} unacked events; results and transitions leave no room"
                f" for {len(incoming)} more within {self.max_events} events and {self.max_bytes} bytes"
            )
        for seq in plan.drop:
            del self._events[seq]
        seq = await self.int_meta("event_seq")
        out = []
        for type_, cls, payload in items:
            seq += 1
            self._events[seq] = JournalEvent(seq, type_, cls, payload)
            out.append(self._events[seq])
        self._meta["event_seq"] = str(seq)
        return out

    def _event_rows(self) -> list[EventRow]:
        return [EventRow(e.seq, e.event_class, len(e.payload)) for e in self._events.values()]

    async def event_stats(self) -> tuple[int, int]:
        return len(self._events), sum(len(e.payload) for e in self._events.values())

    async def is_full(self) -> bool:
        return rules.is_full(self._event_rows(), self.max_events, self.max_bytes)

    async def unacked_events(self, limit: int = 500) -> list[JournalEvent]:
        return list(self._events.values())[:limit]

    async def ack_events(self, upto_seq: int) -> int:
        gone = [seq for seq in self._events if seq <= upto_seq]
        for seq in gone:
            del self._events[seq]
        return len(gone)

    # -- commands ------------------------------------------------------

    async def get_command(self, command_id: str) -> CommandEntry | None:
        return self._entries.get(command_id)

    async def command_body(self, command_id: str) -> bytes | None:
        return self._bodies.get(command_id)

    async def accept(self, a: rules.Acceptance) -> None:
        self._entries[a.command_id] = rules.accept_entry(self._entries.get(a.command_id), a)
        self._bodies[a.command_id] = a.body

    async def mark_running(self, command_id: str, incarnation_id: str, boot_id: str, now: float) -> None:
        self._entries[command_id] = rules.running_entry(self._entries.get(command_id), incarnation_id, boot_id, now)

    async def finish(self, command_id: str, update: bytes, now: float) -> bool:
        update = rules.fit_update(update, self.limits)
        existing = self._entries.get(command_id)
        if existing is None:
            raise rules.UnknownCommand(f"no journal entry for {command_id}: journal a rejection with record_done")
        done = rules.done_entry(existing, update, now)
        if done is None:
            return False
        self._entries[command_id] = done
        return True

    async def record_done(
        self, command_id: str, kind: str, update: bytes, incarnation_id: str, boot_id: str, now: float
    ) -> bool:
        existing = self._entries.get(command_id)
        if existing is None:
            update = rules.fit_update(update, self.limits)
            self._entries[command_id] = rules.rejected_entry(command_id, kind, update, incarnation_id, boot_id, now)
            return True
        return await self.finish(command_id, update, now)

    async def unacked_results(self) -> list[tuple[str, bytes]]:
        return rules.unacked(self._entries.values())

    async def ack_results(self, command_ids: Iterable[str]) -> int:
        n = 0
        for cid in set(command_ids):
            e = self._entries.get(cid)
            if e is not None and e.state == "done" and not e.acked:
                self._entries[cid] = replace(e, acked=True)
                n += 1
        return n

    async def commands(self) -> list[CommandEntry]:
        return sorted(self._entries.values(), key=lambda e: (e.updated_at, e.command_id))

    async def delete_commands(self, command_ids: Iterable[str]) -> int:
        n = 0
        for cid in set(command_ids):
            if self._entries.pop(cid, None) is not None:
                n += 1
            self._bodies.pop(cid, None)
        return n

    async def apply_settlements(
        self, settlements: Sequence[Settlement], updates: Mapping[str, bytes], now: float
    ) -> int:
        fitted = {cid: rules.fit_update(u, self.limits) for cid, u in updates.items()}
        done = rules.settled_entries(settlements, self._entries, fitted, now)
        for entry in done:
            self._entries[entry.command_id] = entry
        return len(done)

    async def sweep_commands(self, now: float, incarnation_id: str, keep_s: float = rules.KEEP_S) -> list[str]:
        ids = rules.sweep(self._entries.values(), now, incarnation_id, keep_s)
        await self.delete_commands(ids)
        return ids

    async def settle_oversized(self) -> list[CommandEntry]:
        refitted = rules.refit(self._entries.values(), self.limits)
        for e in refitted:
            self._entries[e.command_id] = e
        for seq, ev in list(self._events.items()):
            type_, cls, payload = rules.fit_event(ev.type, ev.event_class, ev.payload, self.limits)
            if payload is not ev.payload:
                self._events[seq] = JournalEvent(seq, type_, cls, payload)
        return refitted
