"""One `EnqueueCommands` call's store work: CPU and statements a command, on SQLite and PostgreSQL (issue 19).

`bc.control.commands.runs.run_commands` (what RunCommand and EnqueueCommands call) enqueues K
`inventory.refresh` commands round-robin over N nodes in one transaction, on a fresh store each round,
unsigned (signing is `bench.signing`'s figure). It prints the median CPU microseconds a command (this
process only: on PostgreSQL the server's share is not in it) and the statements a command, counted at
the store's transaction (`Tx.execute` and `Tx.fetchall`; the events log's batched append counts once).
A fleet-wide fan-out is one command a node (`--nodes` = `--commands`); a scheduler's or a script's batch
is several a node.

Usage: python -m bench.enqueue [--nodes 100,1000] [--commands 1000] [--rounds 5] [--store sqlite|postgres|both]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import secrets
import shutil
import statistics
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

from bc.control.commands.runs import RunRequest, run_commands
from bc.control.signing.signer import NullSigner
from bc.store import Store, Tx
from bc.store import nodes as nodes_sql
from bc.store.postgres import PostgresStore, drop_schema
from bc.store.sqlite import SqliteStore
from bench.pg_drivers import PG_URL


@contextmanager
def counted(tx_classes: list[type[Tx]]) -> Iterator[list[int]]:
    """Statements run through these transaction classes while inside, in the list's one element."""
    seen = [0]
    saved: list[tuple[type[Tx], str, Any]] = []
    for cls in tx_classes:
        for name in ("execute", "fetchall"):
            orig = cls.__dict__[name]

            def wrapped(orig: Callable[..., Awaitable[Any]] = orig) -> Callable[..., Awaitable[Any]]:
                async def call(self: Tx, *a: Any, **k: Any) -> Any:
                    seen[0] += 1
                    return await orig(self, *a, **k)

                return call

            saved.append((cls, name, orig))
            setattr(cls, name, wrapped())
    try:
        yield seen
    finally:
        for cls, name, orig in saved:
            setattr(cls, name, orig)


@asynccontextmanager
async def fresh_store(kind: str, url: str) -> AsyncIterator[Store]:
    """A new store, not yet opened, of the driver `bc serve` runs: a SQLite file in a temp dir, or (`kind`
    "postgres") a schema of its own in the database at `url`; removed afterwards."""
    tmp = Path(tempfile.mkdtemp(prefix="bc-bench-store-"))
    schema = "bench_" + secrets.token_hex(4)
    try:
        yield SqliteStore(tmp / "bc.db") if kind == "sqlite" else PostgresStore(url, schema=schema)
    finally:
        if kind == "postgres":
            await drop_schema(url, schema)
        shutil.rmtree(tmp, ignore_errors=True)


async def one_round(store: Store, nodes: int, commands: int) -> tuple[float, int]:
    await store.open()
    try:
        now_ms = await store.now_ms()
        async with store.transaction() as tx:
            for i in range(nodes):
                await nodes_sql.ensure(tx, f"n{i}", "node", now_ms)
        reqs = [RunRequest(f"n{i % nodes}", "inventory.refresh") for i in range(commands)]
        from bc.store.postgres import _PgTx
        from bc.store.sqlite import _SqliteTx

        with counted([_SqliteTx, _PgTx]) as seen:
            t0 = time.process_time()
            await run_commands(store, None, NullSigner(), reqs, "bench", random.Random(1))
            cpu = time.process_time() - t0
        return cpu, seen[0]
    finally:
        await store.close()


async def figures(store_kind: str, nodes: int, commands: int, rounds: int, url: str) -> dict[str, Any]:
    cpus: list[float] = []
    statements = 0
    for _ in range(rounds):
        async with fresh_store(store_kind, url) as store:
            cpu, statements = await one_round(store, nodes, commands)
            cpus.append(cpu)
    return {
        "store": store_kind,
        "nodes": nodes,
        "commands": commands,
        "cpu_us_per_command": round(statistics.median(cpus) / commands * 1e6, 1),
        "statements_per_command": round(statements / commands, 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.enqueue")
    ap.add_argument("--nodes", default="100,1000", help="node counts, comma-separated")
    ap.add_argument("--commands", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--store", choices=("sqlite", "postgres", "both"), default="both")
    ap.add_argument("--url", default=PG_URL)
    args = ap.parse_args()
    kinds = ("sqlite", "postgres") if args.store == "both" else (args.store,)
    for kind in kinds:
        for n in (int(x) for x in args.nodes.split(",") if x.strip()):
            f = asyncio.run(figures(kind, n, args.commands, args.rounds, args.url))
            print(
                f"{kind:8} {n:>6,} nodes, {f['commands']:,} commands in one call: {f['cpu_us_per_command']} us of CPU"
                f" and {f['statements_per_command']} statements a command (median of {args.rounds})",
                flush=True,
            )


if __name__ == "__main__":
    main()
