"""The journal: the agent's only durable memory, one SQLite file, every write fsynced.

Parts (reference: "The journal"): `meta` (node id, journal id, the event
sequence, the applied and observed generations, the server time mark), `spec`
(the last full spec as received: body bytes, hash, signature) and `events`
(journaled, unacked events with their sequence numbers, which rise from 1
per journal id) and `commands` (command id to `accepted`, `running{boot_id}`
or `done` with its serialized terminal `CommandUpdate`, until acked and swept).

The rules (duplicates, recovery, sweep, event bounds) live in
`agent.journal_rules` as pure functions, shared with `agent.memory_journal`;
this module only reads rows, applies a rule and writes the outcome in one
transaction. One lock serializes the journal's units of work: the agent's
workers, its converge loop and its session share one connection, and a
statement issued while another coroutine's transaction is open would join
(and could be rolled back with) that transaction.

Group commit (`agent.journal_batch`): the command writes (`accept`,
`mark_running`, `finish`, `record_done`, `ack_results`) that arrive while
another write's commit is in flight share the next transaction and its one
fsync; each caller returns only once the transaction holding its write has
committed, so `accepted` is durable before a side effect starts, as before.

Sizes: every terminal update is fitted (`journal_rules.fit_update`) and every
event (`fit_event`) before it is written, so nothing journaled is over
`bc.protocol.limits`; `settle_oversized` fits what an older agent left.

Bounds: `append_events` drops the oldest metric events to make room and
raises `JournalFull` (writing nothing) when results and transitions alone
fill the journal; `is_full()` then tells dispatch to answer new commands BUSY.

The two reads of every delivered command (issue 19's pipelined accepts): the
session asks `get_command` (the duplicate rules) and `is_full` (BUSY) for each
command, and a read takes the journal's lock, which a transaction holds through
its COMMIT: a read issued while an `accepted` commits waited for that fsync,
and the next command's accept could never join the transaction in flight.
So `get_command` answers a command id the journal cannot hold (not in
`_ids`, a superset of the ids of its rows: loaded once, an id added by every
row written, committed or not, and dropped only once its delete committed)
without the lock or a trip to the thread, and `is_full` keeps its last answer
until an event write ends (`_events_changed`; an answer read while one was
under way is not kept). Both are exact, for this process is the journal's
only writer (`bc doctor` reads it through a read-only connection).

Durability: `synchronous=FULL` with WAL, so a write has reached the disk
when it returns. A journal that does not open is moved aside
(`journal.db.corrupt-<ms>`, the newest three copies kept: `agent.journal_aside`)
and a new one starts with a new `journal_id`; the server sees the new id at
Hello and deals with what the old one knew.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import sqlite3
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import aiosqlite

from agent import journal_aside
from agent import journal_rules as rules
from agent import journal_tickets as jti_rules
from agent.journal_api import JournalCorrupt, JournalEvent, JournalFull, StoredSpec, new_journal_id
from agent.journal_batch import CommitGroups, TxSteps, one_transaction
from agent.journal_conn import connect_commit_in_thread
from agent.journal_rules import MAX_BYTES, MAX_EVENTS, CommandEntry, CommandState, EventRow, Settlement
from agent.offload import Offload, to_thread
from bc.errors import UsageError
from bc.pki import keys
from bc.pki.secrets_source import os_seeded_random
from bc.protocol.limits import LIMITS, Limits
from bc.protocol.pb import session_pb2
from bc.seams.clock import Clock, SystemClock

__all__ = ["Journal", "JournalCorrupt", "JournalEvent", "JournalFull", "StoredSpec"]

log = logging.getLogger("agent.journal")

SCHEMA = (
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS spec (id INTEGER PRIMARY KEY CHECK (id = 1), generation INTEGER NOT NULL,"
    " spec_hash TEXT NOT NULL, body BLOB NOT NULL, signature BLOB, key_id TEXT NOT NULL DEFAULT '',"
    " full_spec BLOB NOT NULL)",
    "CREATE TABLE IF NOT EXISTS events (seq INTEGER PRIMARY KEY, type TEXT NOT NULL, class INTEGER NOT NULL,"
    " payload BLOB NOT NULL)",
    "CREATE TABLE IF NOT EXISTS commands (command_id TEXT PRIMARY KEY, kind TEXT NOT NULL,"
    " state TEXT NOT NULL CHECK (state IN ('accepted', 'running', 'done')), incarnation_id TEXT NOT NULL,"
    " boot_id TEXT NOT NULL, retry_safe INTEGER NOT NULL, self_terminating INTEGER NOT NULL,"
    " updated_at REAL NOT NULL, result BLOB, acked INTEGER NOT NULL DEFAULT 0, body BLOB)",
    # Each destructive-batch leaf runs at most once, ever: the first command to claim it keeps it.
    "CREATE TABLE IF NOT EXISTS batch_leaves (scope_root TEXT NOT NULL, leaf_index INTEGER NOT NULL,"
    " command_id TEXT NOT NULL, claimed_at REAL NOT NULL, PRIMARY KEY (scope_root, leaf_index))",
    # Every exec ticket used, until it expires (agent.journal_tickets): a ticket opens one tunnel, ever.
    "CREATE TABLE IF NOT EXISTS exec_tickets (jti TEXT PRIMARY KEY, exp_ms INTEGER NOT NULL)",
)

Connect = Callable[[str], Awaitable[aiosqlite.Connection]]
"""Opens the journal's connection (`agent.journal_conn`): in production, statements of a transaction on the
loop and BEGIN/COMMIT on the connection's thread; the simulator passes one that runs each statement inline
on its loop (`bc.sim.file_journal`), and `offload=inline` for the file calls of opening, so the file journal
stays deterministic there."""


_STATES: dict[str, CommandState] = {s: s for s in rules.COMMAND_STATES}
_COMMAND_COLUMNS = (
    "command_id, kind, state, incarnation_id, boot_id, retry_safe, self_terminating, updated_at, result, acked"
)


class Journal:
    def __init__(
        self,
        conn: aiosqlite.Connection,
        path: Path,
        node_id: str,
        journal_id: str,
        *,
        max_events: int = MAX_EVENTS,
        max_bytes: int = MAX_BYTES,
    ) -> None:
        self._conn = conn
        self.path = path
        self.node_id = node_id
        self.journal_id = journal_id
        self.max_events, self.max_bytes = rules.clamp_bounds(max_events, max_bytes)
        self.limits: Limits = LIMITS  # the size table; tests may lower it
        self._lock = asyncio.Lock()
        self._steps = TxSteps(self._begin, self._commit, self._rollback)
        self._groups = CommitGroups(self._lock, self._steps)
        self._ids: set[str] | None = None  # every id a row may have (a superset); None until first read
        self._full: bool | None = None  # is_full's answer while no event was written since; None: read it
        self._events_version = 0  # moved by every event write

    # -- opening -------------------------------------------------------
    @staticmethod
    async def open(
        path: Path,
        node_id: str,
        *,
        rng: random.Random | None = None,
        clock: Clock | None = None,
        max_events: int = MAX_EVENTS,
        max_bytes: int = MAX_BYTES,
        connect: Connect = connect_commit_in_thread,
        offload: Offload = to_thread,
    ) -> Journal:
        """Open or create; a journal of another node is refused, a broken one moved aside.

        `rng` draws a new journal's id and `clock` names a broken one's copy (the agent passes its own; tools
        and tests may leave the production ones). `max_events`/`max_bytes` are the configured event bounds,
        which may lower the built-in ones, never raise them.
        """
        bounds = rules.clamp_bounds(max_events, max_bytes)
        rng = rng or os_seeded_random()
        try:
            return await Journal._open(path, node_id, bounds, rng, connect, offload)
        except (sqlite3.DatabaseError, JournalCorrupt) as e:
            now_ms = int((clock or SystemClock()).now() * 1000)
            aside = path.with_name(journal_aside.aside_name(path.name, now_ms))
            log.error("event=journal.lost path=%s moved_to=%s error=%s", path, aside, e)
            await offload(journal_aside.move_aside, path, aside)
            return await Journal._open(path, node_id, bounds, rng, connect, offload)

    @staticmethod
    async def _open(
        path: Path, node_id: str, bounds: tuple[int, int], rng: random.Random, connect: Connect, offload: Offload
    ) -> Journal:
        await offload(keys.make_private_sqlite, path)  # the journal holds results and specs: 0600
        conn = await connect(str(path))
        try:
            for p in ("PRAGMA journal_mode=WAL", "PRAGMA synchronous=FULL"):
                await conn.execute(p)
            cur = await conn.execute("PRAGMA quick_check")
            row = await cur.fetchone()
            if row is None or row[0] != "ok":
                raise JournalCorrupt(f"quick_check says {row[0] if row else 'nothing'}")
            await conn.execute("BEGIN IMMEDIATE")
            for stmt in SCHEMA:
                await conn.execute(stmt)
            cur = await conn.execute("SELECT key, value FROM meta")
            meta = {k: v for k, v in await cur.fetchall()}
            if "node_id" in meta and meta["node_id"] != node_id:
                await conn.execute("ROLLBACK")
                raise UsageError(
                    f"the journal {path} belongs to node {meta['node_id']}, not {node_id}; move it aside or use"
                    " `bc join --reset --yes`"
                )
            if "journal_id" not in meta:
                meta = {
                    "node_id": node_id,
                    "journal_id": new_journal_id(rng),
                    "event_seq": "0",
                    "applied_generation": "0",
                    "observed_generation": "0",
                    "server_time_mark_ms": "0",
                }
                await conn.executemany("INSERT INTO meta (key, value) VALUES (?, ?)", list(meta.items()))
                log.info("event=journal.created path=%s journal_id=%s", path, meta["journal_id"])
            await conn.execute("COMMIT")
        except BaseException:
            await conn.close()
            raise
        return Journal(conn, path, node_id, meta["journal_id"], max_events=bounds[0], max_bytes=bounds[1])

    async def close(self) -> None:
        await self._groups.wait_idle()
        async with self._lock:
            await self._conn.close()

    @property
    def batches(self) -> CommitGroups:
        """The group commit of the command writes (its `stats` say how many batches formed)."""
        return self._groups

    def _tx(self) -> AbstractAsyncContextManager[None]:
        """One fsynced transaction; the caller holds the lock."""
        return one_transaction(self._steps)

    async def _begin(self) -> None:
        await self._conn.execute("BEGIN IMMEDIATE")

    async def _commit(self) -> None:
        await self._conn.execute("COMMIT")

    async def _rollback(self) -> None:
        if self._conn.in_transaction:
            await self._conn.execute("ROLLBACK")

    # -- meta ----------------------------------------------------------
    async def get_meta(self, key: str, default: str = "") -> str:
        async with self._lock:
            return await self._get_meta(key, default)

    async def _get_meta(self, key: str, default: str = "") -> str:
        cur = await self._conn.execute("SELECT value FROM meta WHERE key = ?", (key,))
        row = await cur.fetchone()
        return str(row[0]) if row else default

    async def set_meta(self, key: str, value: str) -> None:
        async with self._lock:
            await self._set_meta(key, value)

    async def _set_meta(self, key: str, value: str) -> None:
        await self._conn.execute(
            "INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            (key, value),
        )

    async def claim_batch_leaf(self, scope_root: str, leaf_index: int, command_id: str, now: float) -> str:
        """Claim a batch leaf for a command (fsynced); returns the command that holds it, maybe another."""
        async with self._lock:
            await self._conn.execute(
                "INSERT INTO batch_leaves (scope_root, leaf_index, command_id, claimed_at) VALUES (?, ?, ?, ?)"
                " ON CONFLICT (scope_root, leaf_index) DO NOTHING",
                (scope_root, leaf_index, command_id, now),
            )
            async with self._conn.execute(
                "SELECT command_id FROM batch_leaves WHERE scope_root = ? AND leaf_index = ?", (scope_root, leaf_index)
            ) as cur:
                row = await cur.fetchone()
        return str(row[0]) if row else command_id

    async def use_ticket(self, jti: str, exp_ms: int, now_ms: int) -> str:
        """Record exec ticket `jti` as used (fsynced) unless `jti_rules.admit` refuses it: '' or the refusal."""
        async with self._lock, self._tx():
            async with self._conn.execute("SELECT jti, exp_ms FROM exec_tickets") as cur:
                used = {str(r[0]): int(r[1]) for r in await cur.fetchall()}
            verdict = jti_rules.admit(used, jti, exp_ms, now_ms)
            if verdict.forget:
                await self._conn.executemany("DELETE FROM exec_tickets WHERE jti = ?", [(j,) for j in verdict.forget])
            if not verdict.refused:
                await self._conn.execute("INSERT INTO exec_tickets (jti, exp_ms) VALUES (?, ?)", (jti, exp_ms))
            return verdict.refused

    async def int_meta(self, key: str) -> int:
        async with self._lock:
            return await self._int_meta(key)

    async def _int_meta(self, key: str) -> int:
        return int(await self._get_meta(key, "0") or 0)

    async def advance_time_mark(self, server_time_ms: int) -> int:
        """The mark only moves forward; returns the mark now in force."""
        async with self._lock:
            mark = await self._int_meta("server_time_mark_ms")
            if server_time_ms > mark:
                await self._set_meta("server_time_mark_ms", str(server_time_ms))
                return server_time_ms
            return mark

    async def set_observed(self, generation: int) -> None:
        async with self._lock:
            await self._set_meta("observed_generation", str(generation))

    # -- spec ----------------------------------------------------------
    async def store_spec(self, spec: StoredSpec) -> None:
        """The spec and the applied generation move together, in one fsynced transaction."""
        async with self._lock, self._tx():
            await self._conn.execute(
                "INSERT INTO spec (id, generation, spec_hash, body, signature, key_id, full_spec)"
                " VALUES (1, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (id) DO UPDATE SET generation = excluded.generation, spec_hash = excluded.spec_hash,"
                " body = excluded.body, signature = excluded.signature, key_id = excluded.key_id,"
                " full_spec = excluded.full_spec",
                (spec.generation, spec.spec_hash, spec.body, spec.signature, spec.key_id, spec.full_spec),
            )
            await self._set_meta("applied_generation", str(spec.generation))

    async def load_spec(self) -> StoredSpec | None:
        async with self._lock:
            cur = await self._conn.execute(
                "SELECT generation, spec_hash, body, signature, key_id, full_spec FROM spec WHERE id = 1"
            )
            row = await cur.fetchone()
        if row is None:
            return None
        return StoredSpec(
            int(row[0]),
            str(row[1]),
            bytes(row[2]),
            None if row[3] is None else bytes(row[3]),
            str(row[4]),
            bytes(row[5]),
        )

    # -- events --------------------------------------------------------
    async def append_events(self, items: list[tuple[str, int, bytes]]) -> list[JournalEvent]:
        """Journal events with the next sequence numbers, in one transaction, within the bounds.

        Items are (type, class, payload). The oldest metric events make room, dropped in the same transaction;
        when results and transitions alone leave no room, `JournalFull` is raised and nothing is written.
        """
        if not items:
            return []
        items = [self._fit_event(*item) for item in items]
        incoming = [EventRow(0, cls, len(payload)) for _, cls, payload in items]
        try:
            async with self._lock, self._tx():
                await self._make_room(incoming)
                seq = await self._int_meta("event_seq")
                out = []
                for type_, cls, payload in items:
                    seq += 1
                    await self._conn.execute(
                        "INSERT INTO events (seq, type, class, payload) VALUES (?, ?, ?, ?)",
                        (seq, type_, cls, payload),
                    )
                    out.append(JournalEvent(seq, type_, cls, payload))
                await self._set_meta("event_seq", str(seq))
        finally:
            self._events_changed()
        return out

    def _events_changed(self) -> None:
        """An event write ended (committed or not): `is_full` reads again."""
        self._events_version += 1
        self._full = None

    def _fit_update(self, command_id: str, update: bytes) -> bytes:
        fitted = rules.fit_update(update, self.limits)
        if fitted is not update:
            state = session_pb2.CommandUpdate.FromString(fitted)
            log.warning(
                "event=command.update-fitted command=%s bytes=%d reason=%s", command_id, len(update), state.reason
            )
        return fitted

    def _fit_event(self, type_: str, cls: int, payload: bytes) -> tuple[str, int, bytes]:
        fitted = rules.fit_event(type_, cls, payload, self.limits)
        if fitted[2] is not payload:
            log.warning(
                "event=journal.event-too-large type=%s bytes=%d max_event_bytes=%d",
                type_,
                len(payload),
                self.limits.max_event_bytes,
            )
        return fitted

    async def _make_room(self, incoming: list[EventRow]) -> None:
        cur = await self._conn.execute("SELECT count(*), coalesce(sum(length(payload)), 0) FROM events")
        row = await cur.fetchone()
        count, size = (int(row[0]), int(row[1])) if row else (0, 0)
        if rules.within_bounds(
            count + len(incoming), size + sum(e.size for e in incoming), self.max_events, self.max_bytes
        ):
            return  # the common case: no need to read every row
        plan = rules.plan_bounds(await self._event_rows(), incoming, self.max_events, self.max_bytes)
        if not plan.admit:
            log.warning(
                "event=journal.full events=%d bytes=%d incoming=%d max_events=%d max_bytes=%d",
                count,
                size,
                len(incoming),
                self.max_events,
                self.max_bytes,
            )
            raise JournalFull(
                f"the journal holds {count} unacked events ({size} bytes); results and transitions leave no room"
                f" for {len(incoming)} more within {self.max_events} events and {self.max_bytes} bytes"
            )
        if plan.drop:
            await self._conn.executemany("DELETE FROM events WHERE seq = ?", [(s,) for s in plan.drop])
            log.warning("event=journal.metrics_dropped count=%d oldest=%d", len(plan.drop), plan.drop[0])

    async def _event_rows(self) -> list[EventRow]:
        cur = await self._conn.execute("SELECT seq, class, length(payload) FROM events ORDER BY seq")
        return [EventRow(int(r[0]), int(r[1]), int(r[2])) for r in await cur.fetchall()]

    async def is_full(self) -> bool:
        """At a bound even after dropping every metric event: dispatch answers new commands BUSY.

        Read once, then kept until an event write (see the module): asked for every delivered command."""
        if self._full is not None:
            return self._full
        version = self._events_version
        async with self._lock:
            cur = await self._conn.execute(
                "SELECT count(*), coalesce(sum(length(payload)), 0) FROM events WHERE class != ?", (rules.METRIC,)
            )
            row = await cur.fetchone()
        count, size = (int(row[0]), int(row[1])) if row else (0, 0)
        full = rules.at_bound(count, size, self.max_events, self.max_bytes)
        if version == self._events_version:  # no event write began or ended meanwhile
            self._full = full
        return full

    async def event_stats(self) -> tuple[int, int]:
        async with self._lock:
            cur = await self._conn.execute("SELECT count(*), coalesce(sum(length(payload)), 0) FROM events")
            row = await cur.fetchone()
        return (int(row[0]), int(row[1])) if row else (0, 0)

    async def size_bytes(self) -> int:
        """The journal's size on disk: the database file and its write-ahead log."""
        return await asyncio.to_thread(_file_size, self.path)

    async def unacked_events(self, limit: int = 500) -> list[JournalEvent]:
        async with self._lock:
            cur = await self._conn.execute(
                "SELECT seq, type, class, payload FROM events ORDER BY seq LIMIT ?", (limit,)
            )
            rows = await cur.fetchall()
        return [JournalEvent(int(r[0]), str(r[1]), int(r[2]), bytes(r[3])) for r in rows]

    async def ack_events(self, upto_seq: int) -> int:
        try:
            async with self._lock:
                cur = await self._conn.execute("DELETE FROM events WHERE seq <= ?", (upto_seq,))
                return cur.rowcount
        finally:
            self._events_changed()

    # -- commands ------------------------------------------------------
    async def get_command(self, command_id: str) -> CommandEntry | None:
        if self._ids is not None and command_id not in self._ids:
            return None  # no row has it, nor will until a write adds it (see the module): no lock, no trip
        async with self._lock:
            if self._ids is None:
                cur = await self._conn.execute("SELECT command_id FROM commands")
                self._ids = {str(r[0]) for r in await cur.fetchall()}
                if command_id not in self._ids:
                    return None
            return await self._get_command(command_id)

    async def command_body(self, command_id: str) -> bytes | None:
        """The body as accepted (for a re-execution's acceptance checks); None for rejections and unknown ids."""
        async with self._lock:
            cur = await self._conn.execute("SELECT body FROM commands WHERE command_id = ?", (command_id,))
            row = await cur.fetchone()
        return None if row is None or row[0] is None else bytes(row[0])

    async def accept(self, a: rules.Acceptance) -> None:
        """Journal `accepted`; fsynced when it returns, and no side effect may start before it does."""

        async def work(_: None) -> None:
            await self._put_command(rules.accept_entry(await self._get_command(a.command_id), a), a.body)

        await self._groups.run(work)

    async def mark_running(self, command_id: str, incarnation_id: str, boot_id: str, now: float) -> None:
        """Journal `running{boot_id}`; self-terminating kinds call it right before their side effect."""

        async def work(_: None) -> None:
            await self._put_command(
                rules.running_entry(await self._get_command(command_id), incarnation_id, boot_id, now)
            )

        await self._groups.run(work)

    async def finish(self, command_id: str, update: bytes, now: float) -> bool:
        """Journal `done` with the serialized terminal CommandUpdate; False if already done (that result stands)."""
        update = self._fit_update(command_id, update)

        async def work(_: None) -> bool:
            existing = await self._get_command(command_id)
            if existing is None:
                raise rules.UnknownCommand(f"no journal entry for {command_id}: journal a rejection with record_done")
            return await self._put_done(rules.done_entry(existing, update, now))

        return await self._groups.run(work)

    async def record_done(
        self, command_id: str, kind: str, update: bytes, incarnation_id: str, boot_id: str, now: float
    ) -> bool:
        """Journal a terminal outcome whether or not the command was accepted: how rejections are kept."""
        update = self._fit_update(command_id, update)

        async def work(_: None) -> bool:
            existing = await self._get_command(command_id)
            if existing is None:
                return await self._put_done(
                    rules.rejected_entry(command_id, kind, update, incarnation_id, boot_id, now)
                )
            return await self._put_done(rules.done_entry(existing, update, now))

        return await self._groups.run(work)

    async def _put_done(self, done: CommandEntry | None) -> bool:
        if done is None:
            return False  # done already: the first result stands
        await self._put_command(done)
        return True

    async def unacked_results(self) -> list[tuple[str, bytes]]:
        """(command id, serialized terminal CommandUpdate), oldest first: replayed until acked."""
        async with self._lock:
            entries = await self._select_commands("WHERE state = 'done' AND acked = 0")
        return rules.unacked(entries)

    async def ack_results(self, command_ids: Iterable[str]) -> int:
        ids = [(cid,) for cid in sorted(set(command_ids))]
        if not ids:
            return 0

        async def work(_: None) -> int:
            cur = await self._conn.executemany(
                "UPDATE commands SET acked = 1 WHERE command_id = ? AND state = 'done' AND acked = 0", ids
            )
            return int(cur.rowcount)

        return await self._groups.run(work)

    async def commands(self) -> list[CommandEntry]:
        async with self._lock:
            return await self._select_commands("")

    async def delete_commands(self, command_ids: Iterable[str]) -> int:
        ids = [(cid,) for cid in sorted(set(command_ids))]
        if not ids:
            return 0
        async with self._lock, self._tx():
            n = await self._delete_commands(ids)
        self._forget_ids(cid for (cid,) in ids)
        return n

    def _forget_ids(self, ids: Iterable[str]) -> None:
        """Rows whose delete committed: `get_command` no longer reads for them."""
        if self._ids is not None:
            self._ids.difference_update(ids)

    async def apply_settlements(
        self, settlements: Sequence[Settlement], updates: Mapping[str, bytes], now: float
    ) -> int:
        """Mark `recover`'s settlements done with their updates, in one transaction; returns how many moved."""
        updates = {cid: self._fit_update(cid, u) for cid, u in updates.items()}
        async with self._lock, self._tx():
            existing = {}
            for s in settlements:
                if (entry := await self._get_command(s.command_id)) is not None:
                    existing[s.command_id] = entry
            done = rules.settled_entries(settlements, existing, updates, now)
            for entry in done:
                await self._put_command(entry)
        return len(done)

    async def sweep_commands(self, now: float, incarnation_id: str, keep_s: float = rules.KEEP_S) -> list[str]:
        """Apply `journal_rules.sweep` and delete what it names, in one transaction."""
        async with self._lock, self._tx():
            ids = rules.sweep(await self._select_commands(""), now, incarnation_id, keep_s)
            if ids:
                await self._delete_commands([(cid,) for cid in ids])
        self._forget_ids(ids)
        return ids

    async def settle_oversized(self) -> list[CommandEntry]:
        """Fit what an older agent journaled over the limits, in one transaction; returns the refitted entries.

        A done entry whose result is over `max_result_bytes` becomes FAILED `result-too-large` (unacked ones
        go out at the next Hello), and an event over `max_event_bytes` becomes `event.too-large` under its seq.
        """
        smallest = self.limits.max_text_bytes  # an update this small cannot be over any limit
        try:
            return await self._settle_oversized(smallest)
        finally:
            self._events_changed()

    async def _settle_oversized(self, smallest: int) -> list[CommandEntry]:
        async with self._lock, self._tx():
            refitted = rules.refit(
                await self._select_commands("WHERE state = 'done' AND length(result) > ?", (smallest,)), self.limits
            )
            for e in refitted:
                await self._put_command(e)
            cur = await self._conn.execute(
                "SELECT seq, type, class, payload FROM events WHERE length(payload) > ?", (self.limits.max_event_bytes,)
            )
            for seq, type_, cls, payload in await cur.fetchall():
                new_type, new_cls, new_payload = rules.fit_event(str(type_), int(cls), bytes(payload), self.limits)
                await self._conn.execute(
                    "UPDATE events SET type = ?, class = ?, payload = ? WHERE seq = ?",
                    (new_type, new_cls, new_payload, seq),
                )
                log.warning("event=journal.event-too-large seq=%d type=%s bytes=%d", seq, type_, len(payload))
        for e in refitted:
            log.warning("event=journal.oversized-settled command=%s kind=%s", e.command_id, e.kind)
        return refitted

    async def _get_command(self, command_id: str) -> CommandEntry | None:
        found = await self._select_commands("WHERE command_id = ?", (command_id,))
        return found[0] if found else None

    async def _select_commands(self, where: str, args: tuple[str | int, ...] = ()) -> list[CommandEntry]:
        cur = await self._conn.execute(
            f"SELECT {_COMMAND_COLUMNS} FROM commands {where} ORDER BY updated_at, command_id", args
        )
        return [_command_entry(r) for r in await cur.fetchall()]

    async def _put_command(self, e: CommandEntry, body: bytes | None = None) -> None:
        """Upsert a row; a None body keeps the one stored at accept."""
        if self._ids is not None:
            self._ids.add(e.command_id)  # before the row exists: `_ids` stays a superset, whatever the commit does
        await self._conn.execute(
            f"INSERT INTO commands ({_COMMAND_COLUMNS}, body) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
            " ON CONFLICT (command_id) DO UPDATE SET kind = excluded.kind, state = excluded.state,"
            " incarnation_id = excluded.incarnation_id, boot_id = excluded.boot_id,"
            " retry_safe = excluded.retry_safe, self_terminating = excluded.self_terminating,"
            " updated_at = excluded.updated_at, result = excluded.result, acked = excluded.acked,"
            " body = coalesce(excluded.body, commands.body)",
            (
                e.command_id,
                e.kind,
                e.state,
                e.incarnation_id,
                e.boot_id,
                int(e.retry_safe),
                int(e.self_terminating),
                e.updated_at,
                e.result,
                int(e.acked),
                body,
            ),
        )

    async def _delete_commands(self, ids: list[tuple[str]]) -> int:
        cur = await self._conn.executemany("DELETE FROM commands WHERE command_id = ?", ids)
        return cur.rowcount


def _command_entry(r: Sequence[Any]) -> CommandEntry:
    state = _STATES.get(str(r[2]))
    if state is None:
        raise JournalCorrupt(f"command {r[0]} has state {r[2]!r}")
    return CommandEntry(
        command_id=str(r[0]),
        kind=str(r[1]),
        state=state,
        incarnation_id=str(r[3]),
        boot_id=str(r[4]),
        retry_safe=bool(r[5]),
        self_terminating=bool(r[6]),
        updated_at=float(r[7]),
        result=None if r[8] is None else bytes(r[8]),
        acked=bool(r[9]),
    )


def _file_size(path: Path) -> int:
    total = 0
    for suffix in ("", "-wal"):
        with contextlib.suppress(FileNotFoundError):
            total += Path(str(path) + suffix).stat().st_size
    return total
