"""psycopg 3 or asyncpg for the PostgreSQL store: both measured on the paths that matter (`make bench`).

The store's driver is psycopg 3 (bc/store/postgres.py). This benchmark runs the same control-plane code,
unchanged, over it and over a minimal asyncpg driver written here for the comparison (it is not shipped),
on three paths: the Hello transaction (`bc.gateway.hello.hello_transaction`), one `enqueue` and the
dispatch pass its poke makes (`bc.control.commands.dispatch.dispatch_gateway` over that node, as the gateway's
dispatcher passes over the poked nodes only) and a status write (`bc.control.nodes.status.ingest`). Each path
runs N times, one node after another, on a fresh schema; it prints transactions per second per driver and
the ratio. Then the gateway's pass over all N nodes, as it makes one every second, with one command to send
(`full_pass_ms`, the median of up to 20), and a fleet-wide command: one `inventory.refresh` to each of the N
nodes, and the time the gateway's one dispatch pass takes to send them all (`fleet_wide_dispatch_ms`;
ceil(N/1000) write transactions).

Until 2026-12-03 the second path ran a pass over every node after each enqueue, so it measured N nodes' reads
per command, not the poked node's (issue 19: 6.8/s at 200 nodes, of which the enqueue was 3 ms).

Usage: python -m bench.pg_drivers [--nodes 200] [--rounds 3] [--url postgresql://postgres@127.0.0.1/test]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import secrets
import statistics
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from functools import lru_cache
from typing import Any

import asyncpg  # type: ignore[import-untyped]
from cryptography.hazmat.primitives import serialization
from google.protobuf import any_pb2

from bc.control.base.bus import Bus
from bc.control.commands.dispatch import dispatch_gateway
from bc.control.commands.queue import EnqueueRequest, enqueue
from bc.control.nodes.status import ingest
from bc.control.signing.signer import NullSigner
from bc.gateway.admission import MAX_PENDING_HELLOS
from bc.gateway.hello import hello_in, hello_transaction
from bc.pki import keys
from bc.pki.ca import CertificateAuthority
from bc.pki.identity import PeerIdentity, make_csr, peer_identity
from bc.pki.secrets_source import SystemSecrets
from bc.protocol.pb import kinds_pb2, session_pb2
from bc.runtime.aio import outside_world
from bc.seams.clock import SystemClock
from bc.store import Store, StoreError, Tx
from bc.store import identity as id_sql
from bc.store import leases as leases_sql
from bc.store import nodes as nodes_sql
from bc.store.base import Params, Row
from bc.store.group_commit import GroupCommit
from bc.store.migrate import apply_migrations
from bc.store.postgres import PostgresStore, drop_schema

GW = "gw-bench"
PG_URL = "postgresql://postgres@127.0.0.1/test"
"""The database the PostgreSQL benchmarks use: the machine's local one (each run makes a schema of its own)."""
_PARAM = re.compile(r"'(?:[^']|'')*'|::|(?<![\w:]):([A-Za-z_]\w*)")


@lru_cache(maxsize=4096)
def to_dollar(sql: str) -> tuple[str, tuple[str, ...]]:
    """`:name` → `$n` (asyncpg's positional style) and the names in order."""
    names: list[str] = []

    def sub(m: re.Match[str]) -> str:
        if not m.group(1):
            return m.group(0)
        if m.group(1) not in names:
            names.append(m.group(1))
        return f"${names.index(m.group(1)) + 1}"

    return _PARAM.sub(sub, sql), tuple(names)


class _AsyncpgTx(Tx):
    def __init__(self, conn: Any) -> None:
        super().__init__()
        self._conn = conn

    async def execute(self, sql: str, params: Params | None = None) -> int:
        q, names = to_dollar(sql)
        try:
            with outside_world():
                status = await self._conn.execute(q, *[(params or {})[n] for n in names])
        except asyncpg.PostgresError as e:
            raise StoreError(str(e)) from e
        tail = str(status).rsplit(" ", 1)[-1]
        return int(tail) if tail.isdigit() else 0

    async def fetchall(self, sql: str, params: Params | None = None) -> list[Row]:
        q, names = to_dollar(sql)
        try:
            with outside_world():
                rows = await self._conn.fetch(q, *[(params or {})[n] for n in names])
        except asyncpg.PostgresError as e:
            raise StoreError(str(e)) from e
        return [dict(r) for r in rows]


class AsyncpgStore(Store):
    """The comparison's asyncpg driver: a pool, one writer per process, as PostgresStore."""

    dialect = "postgres"

    def __init__(self, url: str, schema: str) -> None:
        self.url, self.schema = url, schema
        self.clock = SystemClock()
        self._pool: Any = None
        self._write_lock = asyncio.Lock()

    @property
    def description(self) -> str:
        return f"asyncpg {self.url} (schema {self.schema})"

    async def open(self, *, migrate: bool = True) -> None:
        conn = await asyncpg.connect(self.url)
        try:
            await conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{self.schema}"')
        finally:
            await conn.close()
        self._pool = await asyncpg.create_pool(
            self.url, min_size=1, max_size=8, server_settings={"search_path": self.schema}
        )
        if migrate:
            await apply_migrations(self)

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.close()

    @asynccontextmanager
    async def _begin(self, write: bool) -> AsyncIterator[Tx]:
        async def body() -> AsyncIterator[Tx]:
            async with self._pool.acquire() as conn, conn.transaction():
                yield _AsyncpgTx(conn)

        if write:
            async with self._write_lock:
                async for tx in body():
                    yield tx
        else:
            async for tx in body():
                yield tx

    async def now(self) -> float:
        return self.clock.now()


async def _peers(store: Store, n: int) -> list[PeerIdentity]:
    ca = CertificateAuthority.create(SystemClock(), random.Random(1), SystemSecrets())
    now_ms = await store.now_ms()
    peers = []
    async with store.transaction() as tx:
        await leases_sql.acquire(tx, f"gateway:{GW}", GW, now_ms, 3_600_000)
        for i in range(n):
            node_id = f"n{i}"
            await nodes_sql.ensure(tx, node_id, "node", now_ms)
            cert = ca.issue_node_cert(make_csr(keys.generate_key(), node_id), node_id, "node", 1)
            await id_sql.insert_cert(
                tx,
                serial=format(cert.serial_number, "x"),
                node_id=node_id,
                identity_generation=1,
                cert_pem=cert.public_bytes(serialization.Encoding.PEM).decode(),
                issued_at_ms=now_ms,
                not_after_ms=int(cert.not_valid_after_utc.timestamp() * 1000),
            )
            peers.append(peer_identity(cert, ca.certificate))
    return peers


async def _timed(n: int, one: Callable[[int], Awaitable[object]]) -> float:
    t0 = time.perf_counter()
    for i in range(n):
        await one(i)
    return n / (time.perf_counter() - t0)


async def measure(store: Store, n: int) -> dict[str, float]:
    await store.open()
    bus, signer, rng = Bus(), NullSigner(), random.Random(7)
    try:
        peers = await _peers(store, n)
        epochs: dict[str, int] = {}

        async def hello(i: int) -> None:
            h = session_pb2.Hello(node_id=f"n{i}", boot_id="b", journal_id="j", incarnation_id="i")
            epochs[f"n{i}"] = (await hello_transaction(store, bus, signer, GW, peers[i], h)).epoch

        async def storm() -> float:
            """Every node's Hello at once, at most `MAX_PENDING_HELLOS` in flight, through one `GroupCommit` as
            the gateway runs them: the Hellos a second one gateway admits in a reconnect storm, store-bound."""
            group, slots = GroupCommit(store), asyncio.Semaphore(MAX_PENDING_HELLOS)

            async def one(i: int) -> None:
                async with slots:
                    h = session_pb2.Hello(node_id=f"n{i}", boot_id="b", journal_id="j", incarnation_id="i")
                    now_ms = await store.now_ms()
                    res = await group.run(lambda tx: hello_in(tx, store.dialect, bus, signer, GW, peers[i], h, now_ms))
                    epochs[f"n{i}"] = res.epoch

            t0 = time.perf_counter()
            await asyncio.gather(*(one(i) for i in range(n)))
            return n / (time.perf_counter() - t0)

        payload = any_pb2.Any()
        payload.Pack(kinds_pb2.InventoryRefreshRequest())

        async def dispatch(i: int) -> None:
            await enqueue(
                store, bus, signer, EnqueueRequest(node_id=f"n{i}", kind="inventory.refresh", payload=payload), rng
            )
            await dispatch_gateway(store, bus, GW, epochs, nodes={f"n{i}"})

        async def full_pass() -> float:
            """The once-a-second pass over every node, with one command (enqueued first, not timed) to send."""
            took = []
            for i in range(min(n, 20)):
                req = EnqueueRequest(node_id=f"n{i}", kind="inventory.refresh", payload=payload)
                await enqueue(store, bus, signer, req, rng)
                t0 = time.perf_counter()
                done = await dispatch_gateway(store, bus, GW, epochs)
                took.append((time.perf_counter() - t0) * 1000)
                assert len(done.sends) == 1
            return statistics.median(took)

        async def status(i: int) -> None:
            rep = session_pb2.StatusReport(applied_generation=1, observed_generation=1, applied_spec_hash="h")
            await ingest(store, bus, f"n{i}", epochs[f"n{i}"], rep, publish_it=True)

        async def fleet_wide() -> float:
            """One command to every node (enqueued first, not timed), then the dispatch that sends them all."""
            for i in range(n):
                req = EnqueueRequest(node_id=f"n{i}", kind="inventory.refresh", payload=payload)
                await enqueue(store, bus, signer, req, rng)
            t0 = time.perf_counter()
            await dispatch_gateway(store, bus, GW, epochs)
            return (time.perf_counter() - t0) * 1000

        return {
            "hello_tx_per_s": round(await _timed(n, hello), 1),
            "hello_storm_per_s": round(await storm(), 1),
            "enqueue_and_dispatch_per_s": round(await _timed(n, dispatch), 1),
            "status_writes_per_s": round(await _timed(n, status), 1),
            "full_pass_ms": round(await full_pass(), 1),
            "fleet_wide_dispatch_ms": round(await fleet_wide(), 1),
        }
    finally:
        await store.close()


async def run(nodes: int, url: str, rounds: int = 3) -> dict[str, Any]:
    """`rounds` rounds, the drivers' order alternating (the second of a pair meets a warmer server); medians."""
    makers: dict[str, Callable[[str], Store]] = {
        "psycopg": lambda s: PostgresStore(url, schema=s),
        "asyncpg": lambda s: AsyncpgStore(url, s),
    }
    seen: dict[str, list[dict[str, float]]] = {name: [] for name in makers}
    for r in range(rounds):
        for name in sorted(makers, reverse=bool(r % 2)):
            schema = "bench_" + secrets.token_hex(4)
            try:
                seen[name].append(await measure(makers[name](schema), nodes))
            finally:
                await drop_schema(url, schema)
    out: dict[str, Any] = {"nodes": nodes, "rounds": rounds}
    for name, runs in seen.items():
        out[name] = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    out["asyncpg_over_psycopg"] = {k: round(out["asyncpg"][k] / out["psycopg"][k], 2) for k in out["psycopg"]}
    return out


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=200)
    ap.add_argument("--url", default=PG_URL)
    ap.add_argument("--rounds", type=int, default=3)
    return ap


def main() -> None:
    args = parser().parse_args()
    print("PostgreSQL drivers:", json.dumps(asyncio.run(run(args.nodes, args.url, args.rounds))), flush=True)


if __name__ == "__main__":
    main()
