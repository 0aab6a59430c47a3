"""The journal: the agent's only durable memory, one SQLite file, every write fsynced.

Parts (reference: "The journal"): `meta` (node id, journal id, the event
sequence, the applied and observed generations, the server time mark), `spec`
(the last full spec as received: body bytes, hash, signature) and `events`
(journaled, unacked events with their sequence numbers, which rise from 1
per journal id). Commands join in their own issue.

Durability: `synchronous=FULL` with WAL, so a write has reached the disk
when it returns. A journal that does not open is moved aside
(`journal.db.corrupt-<ms>`), never deleted, and a new one starts with a new
`journal_id`; the server sees the new id at Hello and deals with what the
old one knew.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

import aiosqlite

from bc.errors import UsageError

log = logging.getLogger("agent.journal")

SCHEMA = (
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS spec (id INTEGER PRIMARY KEY CHECK (id = 1), generation INTEGER NOT NULL,"
    " spec_hash TEXT NOT NULL, body BLOB NOT NULL, signature BLOB, key_id TEXT NOT NULL DEFAULT '',"
    " full_spec BLOB NOT NULL)",
    "CREATE TABLE IF NOT EXISTS events (seq INTEGER PRIMARY KEY, type TEXT NOT NULL, class INTEGER NOT NULL,"
    " payload BLOB NOT NULL)",
)


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


class Journal:
    def __init__(self, conn: aiosqlite.Connection, path: Path, node_id: str, journal_id: str) -> None:
        self._conn = conn
        self.path = path
        self.node_id = node_id
        self.journal_id = journal_id

    # -- opening -------------------------------------------------------
    @staticmethod
    async def open(path: Path, node_id: str) -> Journal:
        """Open or create; a journal of another node is refused, a broken one moved aside."""
        try:
            return await Journal._open(path, node_id)
        except (sqlite3.DatabaseError, JournalCorrupt) as e:
            aside = path.with_name(f"{path.name}.corrupt-{int(time.time() * 1000)}")
            log.error("event=journal.lost path=%s moved_to=%s error=%s", path, aside, e)
            await asyncio.to_thread(_move_aside, path, aside)
            return await Journal._open(path, node_id)

    @staticmethod
    async def _open(path: Path, node_id: str) -> Journal:
        path.parent.mkdir(parents=True, exist_ok=True)
        conn = await aiosqlite.connect(str(path), isolation_level=None)
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
                    "journal_id": "j-" + secrets.token_hex(8),
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
        return Journal(conn, path, node_id, meta["journal_id"])

    async def close(self) -> None:
        await self._conn.close()

    # -- meta ----------------------------------------------------------
    async def get_meta(self, key: str, default: str = "") -> str:
        cur = await self._conn.execute("SELECT value FROM meta WHERE key = ?", (key,))
        row = await cur.fetchone()
        return str(row[0]) if row else default

    async def set_meta(self, key: str, value: str) -> None:
        await self._set_meta(key, value)

    async def _set_meta(self, key: str, value: str) -> None:
        await self._conn.execute(
            "INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            (key, value),
        )

    async def int_meta(self, key: str) -> int:
        return int(await self.get_meta(key, "0") or 0)

    async def advance_time_mark(self, server_time_ms: int) -> int:
        """The mark only moves forward; returns the mark now in force."""
        mark = await self.int_meta("server_time_mark_ms")
        if server_time_ms > mark:
            await self._set_meta("server_time_mark_ms", str(server_time_ms))
            return server_time_ms
        return mark

    async def set_observed(self, generation: int) -> None:
        await self._set_meta("observed_generation", str(generation))

    # -- spec ----------------------------------------------------------
    async def store_spec(self, spec: StoredSpec) -> None:
        """The spec and the applied generation move together, in one fsynced transaction."""
        await self._conn.execute("BEGIN IMMEDIATE")
        try:
            await self._conn.execute(
                "INSERT INTO spec (id, generation, spec_hash, body, signature, key_id, full_spec)"
                " VALUES (1, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (id) DO UPDATE SET generation = excluded.generation, spec_hash = excluded.spec_hash,"
                " body = excluded.body, signature = excluded.signature, key_id = excluded.key_id,"
                " full_spec = excluded.full_spec",
                (spec.generation, spec.spec_hash, spec.body, spec.signature, spec.key_id, spec.full_spec),
            )
            await self._set_meta("applied_generation", str(spec.generation))
            await self._conn.execute("COMMIT")
        except BaseException:
            await self._conn.execute("ROLLBACK")
            raise

    async def load_spec(self) -> StoredSpec | None:
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
        """Journal events with the next sequence numbers, in one transaction."""
        if not items:
            return []
        await self._conn.execute("BEGIN IMMEDIATE")
        try:
            seq = await self.int_meta("event_seq")
            out = []
            for type_, cls, payload in items:
                seq += 1
                await self._conn.execute(
                    "INSERT INTO events (seq, type, class, payload) VALUES (?, ?, ?, ?)", (seq, type_, cls, payload)
                )
                out.append(JournalEvent(seq, type_, cls, payload))
            await self._set_meta("event_seq", str(seq))
            await self._conn.execute("COMMIT")
        except BaseException:
            await self._conn.execute("ROLLBACK")
            raise
        return out

    async def unacked_events(self, limit: int = 500) -> list[JournalEvent]:
        cur = await self._conn.execute("SELECT seq, type, class, payload FROM events ORDER BY seq LIMIT ?", (limit,))
        return [JournalEvent(int(r[0]), str(r[1]), int(r[2]), bytes(r[3])) for r in await cur.fetchall()]

    async def ack_events(self, upto_seq: int) -> int:
        cur = await self._conn.execute("DELETE FROM events WHERE seq <= ?", (upto_seq,))
        return cur.rowcount


class JournalCorrupt(Exception):
    pass


def _move_aside(path: Path, aside: Path) -> None:
    """Rename, never delete: the old journal may still matter to whoever investigates."""
    for suffix in ("", "-wal", "-shm"):
        p = Path(str(path) + suffix)
        if p.exists():
            os.replace(p, Path(str(aside) + suffix))
