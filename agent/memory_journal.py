"""The command half of the journal, in memory: for the simulator and the property tests.

It applies the same rules as the SQLite journal (`agent.journal_rules`), so a
scenario that holds here holds on disk. "Durable" means surviving a simulated
crash: the simulator keeps the `MemoryJournal` and replaces the process
around it, which is exactly what a restart does to the file. Nothing here is
lost with a process; what a crash loses is the work in flight, not the
journal.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace

from agent import journal_rules as rules
from agent.journal_rules import CommandEntry, Settlement
from bc.protocol.limits import LIMITS, Limits


class MemoryJournal:
    def __init__(self) -> None:
        self._entries: dict[str, CommandEntry] = {}
        self._bodies: dict[str, bytes] = {}
        self.limits: Limits = LIMITS

    async def get_command(self, command_id: str) -> CommandEntry | None:
        return self._entries.get(command_id)

    async def command_body(self, command_id: str) -> bytes | None:
        return self._bodies.get(command_id)

    async def accept(
        self,
        command_id: str,
        kind: str,
        retry_safe: bool,
        self_terminating: bool,
        incarnation_id: str,
        boot_id: str,
        body: bytes,
        now: float,
    ) -> None:
        entry = rules.accept_entry(
            self._entries.get(command_id),
            command_id,
            kind,
            retry_safe,
            self_terminating,
            incarnation_id,
            boot_id,
            now,
        )
        self._entries[command_id] = entry
        self._bodies[command_id] = body

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
        missing = [s.command_id for s in settlements if s.command_id not in updates]
        if missing:
            raise KeyError(f"no update for settlements {missing}")
        n = 0
        for s in settlements:
            existing = self._entries.get(s.command_id)
            if existing is None:
                continue
            done = rules.done_entry(existing, rules.fit_update(updates[s.command_id], self.limits), now)
            if done is not None:
                self._entries[s.command_id] = done
                n += 1
        return n

    async def sweep_commands(self, now: float, incarnation_id: str, keep_s: float = rules.KEEP_S) -> list[str]:
        ids = rules.sweep(self._entries.values(), now, incarnation_id, keep_s)
        await self.delete_commands(ids)
        return ids

    async def settle_oversized(self) -> list[CommandEntry]:
        refitted = rules.refit(self._entries.values(), self.limits)
        for e in refitted:
            self._entries[e.command_id] = e
        return refitted
