"""`bc serve`'s store work a command, without gRPC: CPU and statements a command, on SQLite and PostgreSQL (issue 19).

K `inventory.refresh` commands round-robin over N nodes with open sessions on one gateway: enqueued with
`enqueue_all` in chunks, sent by the gateway's dispatch passes (`dispatch_gateway`, a pass over the nodes
the last one sent to, as a settled command's poke asks), and each reported `accepted`, `running` and
`succeeded` through `GroupCommit` with every session's report of a round in flight at once, as the gateway
applies them. The store is the driver `bc serve` runs (`SqliteStore`, or `PostgresStore` on a fresh schema).
It prints CPU microseconds a command (this process: on PostgreSQL the server's share is not in it) by phase,
and statements a command (`bench.enqueue.counted`; BEGIN and COMMIT not counted). The gateway's session
reads, gRPC and signing are not in it: `bench.throughput` measures the whole serve.

Usage: python -m bench.serve_store [--nodes 100] [--commands 3000] [--rounds 3] [--store sqlite|postgres|both]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time

from google.protobuf import any_pb2

from bc.control.base.bus import Bus
from bc.control.commands.dispatch import dispatch_gateway
from bc.control.commands.queue import EnqueueRequest, UpdateOutcome, apply_update, enqueue_all
from bc.control.signing.signer import NullSigner
from bc.protocol.pb import session_pb2 as pb
from bc.store import Store
from bc.store import nodes as nodes_sql
from bc.store.group_commit import GroupCommit
from bc.store.postgres import _PgTx
from bc.store.sqlite import _SqliteTx
from bench.enqueue import counted, fresh_store
from bench.pg_drivers import PG_URL

REPORTS = (pb.COMMAND_ACKED, pb.COMMAND_RUNNING, pb.COMMAND_SUCCEEDED)
CHUNK = 500


async def one_round(store: Store, nodes: int, k: int) -> tuple[dict[str, float], int]:
    """CPU seconds by phase, and statements, for k commands."""
    await store.open()
    try:
        bus, group, signer, rng = Bus(), GroupCommit(store), NullSigner(), random.Random(1)
        epochs: dict[str, int] = {}
        now_ms = await store.now_ms()
        async with store.transaction() as tx:
            for i in range(nodes):
                node_id = f"n{i:04d}"
                await nodes_sql.ensure(tx, node_id, "node", now_ms)
                opened = await nodes_sql.open_session(
                    tx,
                    node_id=node_id,
                    gateway_id="gw-1",
                    journal_id="j",
                    boot_id="b",
                    incarnation_id="i",
                    cert_serial=f"s{i}",
                    now_ms=now_ms,
                )
                epochs[node_id] = opened.epoch
        cpu = {"enqueue": 0.0, "dispatch": 0.0, "updates": 0.0}

        async def report(node_id: str, command_id: str, state: pb.CommandState) -> UpdateOutcome:
            now = await store.now_ms()
            result = b"{}" if state == pb.COMMAND_SUCCEEDED else b""
            update = pb.CommandUpdate(command_id=command_id, state=state, boot_id="b", result=result)
            return await group.run(lambda tx: apply_update(tx, bus, signer, node_id, update, now))

        with counted([_SqliteTx, _PgTx]) as seen:
            t = time.process_time()
            for start in range(0, k, CHUNK):
                reqs = [
                    EnqueueRequest(node_id=f"n{i % nodes:04d}", kind="inventory.refresh", payload=any_pb2.Any())
                    for i in range(start, min(k, start + CHUNK))
                ]
                await enqueue_all(store, bus, signer, reqs, rng)
            cpu["enqueue"] = time.process_time() - t
            settled, poked = 0, None
            while settled < k:
                t = time.process_time()
                done = await dispatch_gateway(store, bus, "gw-1", epochs, nodes=poked)
                cpu["dispatch"] += time.process_time() - t
                sent = [(n, f.id) for n, s in done.sends.items() for f in s.commands]
                if not sent:
                    poked = None
                    continue
                t = time.process_time()
                for state in REPORTS:
                    await asyncio.gather(*(report(n, cid, state) for n, cid in sent))
                cpu["updates"] += time.process_time() - t
                settled += len(sent)
                poked = {n for n, _ in sent}
        return cpu, seen[0]
    finally:
        await store.close()


async def figures(kind: str, nodes: int, k: int, rounds: int, url: str) -> str:
    runs: list[dict[str, float]] = []
    statements = 0
    for _ in range(rounds):
        async with fresh_store(kind, url) as store:
            cpu, statements = await one_round(store, nodes, k)
            runs.append(cpu)
    med = {p: statistics.median(r[p] for r in runs) / k * 1e6 for p in runs[0]}
    phases = ", ".join(f"{p} {v:.0f}" for p, v in med.items())
    return (
        f"{kind:8} {nodes:,} nodes, {k:,} commands: {sum(med.values()):.0f} us of CPU a command ({phases}; medians"
        f" of {rounds}), {statements / k:.2f} statements a command"
    )


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.serve_store")
    ap.add_argument("--nodes", type=int, default=100)
    ap.add_argument("--commands", type=int, default=3000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--store", choices=("sqlite", "postgres", "both"), default="both")
    ap.add_argument("--url", default=PG_URL)
    args = ap.parse_args()
    for kind in ("sqlite", "postgres") if args.store == "both" else (args.store,):
        print(asyncio.run(figures(kind, args.nodes, args.commands, args.rounds, args.url)), flush=True)


if __name__ == "__main__":
    main()
