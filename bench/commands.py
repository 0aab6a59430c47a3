"""Command figures for `make bench`.

1. End-to-end commands per second: `inventory.refresh` enqueued through the
   Admin API until every one is SUCCEEDED, against 1, 10 and 100 nodes. `bc
   serve` is a subprocess; the agents share the bench's process (the issue
   allows it) and each keeps its own fsynced journal.
2. The agent journal's `accepted` + `done` writes per second next to the raw
   fsynced SQLite commit rate of the same disk, measured in the same run
   (each shape right after raw commits, in rounds), with commands one at a time and as many in flight as
   the control lane, or every lane, takes (the dispatcher's shape: the session
   reads the journal for each command, accepts it without waiting for the
   write, the lane's workers finish). The ratio says how close the journal
   runs to the disk's limit; a warning line is printed for each ratio below
   0.8 (issue 19). With commands in flight the journal's group commit puts
   several writes in one fsync, so the ratio may pass 1.

`bc serve` runs with whatever flags the caller passes (`serve_args`; none by
default, so a new install signs commands): `bench.signing` uses that to run
the same workload with `--command-signing off` and `on`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import shutil
import sqlite3
import statistics
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agent.app import Agent, AgentOptions
from agent.join import join_node
from agent.journal import Journal
from agent.journal_rules import Acceptance
from bc.protocol import kinds
from bench.run import Lab


async def serve(lab: Lab, serve_args: Sequence[str] = ()) -> subprocess.Popen[bytes]:
    """`lab.serve()`, with extra `bc serve` flags when there are any."""
    if not serve_args:
        return await lab.serve()
    server = lab.root / "server"
    p = lab.spawn("serve", "serve", "--data-dir", str(server), "--listen", lab.address, *serve_args)
    cfg = server / "operator" / "config.json"
    for _ in range(300):
        if cfg.exists():
            break
        await asyncio.sleep(0.05)
    return p


async def commands_per_second(nodes: int, commands: int, serve_args: Sequence[str] = ()) -> dict[str, Any]:
    """Enqueue `commands` inventory.refresh over `nodes` nodes; the rate at which they all reach SUCCEEDED.

    `agents_enforcing` counts the agents whose trust bundle holds a command-signing
    root, i.e. that checked a signature on every command they ran.
    """
    root = Path(tempfile.mkdtemp(prefix=f"bc-bench-cmd{nodes}-"))
    lab = Lab(root)
    agents: list[Agent] = []
    tasks: list[asyncio.Task[None]] = []
    try:
        await serve(lab, serve_args)
        async with lab.admin() as admin:
            sem = asyncio.Semaphore(16)

            async def join(i: int) -> None:
                async with sem:
                    tok = await admin.create_token(f"c{i:04d}")
                    await join_node(lab.address, tok.token, root / f"c{i:04d}")

            await asyncio.gather(*(join(i) for i in range(nodes)))
            for i in range(nodes):
                a = Agent(AgentOptions(data_dir=root / f"c{i:04d}", fake_hw="hgx-h100-8"))
                agents.append(a)
                tasks.append(asyncio.create_task(a.run()))
            while True:  # polling the Admin API: the bench is a client like any other
                if sum(1 for n in await admin.list_nodes() if n.state == "connected") >= nodes:
                    break
                await asyncio.sleep(0.2)
            settled: set[str] = set()
            done = asyncio.Event()
            ids: set[str] = set()

            async def follow(after: int) -> None:
                async for ev in admin.watch(after_seq=after, type_prefix="command.settled"):
                    if json.loads(ev.data_json).get("state") == "succeeded":
                        settled.add(ev.subject)
                        if ids and ids <= settled:
                            done.set()

            watcher = asyncio.create_task(follow((await admin.server_info()).event_seq))
            t0 = time.perf_counter()
            sem2 = asyncio.Semaphore(64)

            async def run(i: int) -> None:
                async with sem2:
                    c = await admin.run_command(f"c{i % nodes:04d}", "inventory.refresh")
                    ids.add(c.id)

            await asyncio.gather(*(run(i) for i in range(commands)))
            if not ids <= settled:
                await asyncio.wait_for(done.wait(), 300)
            elapsed = time.perf_counter() - t0
            watcher.cancel()
        return {
            "nodes": nodes,
            "commands": commands,
            "seconds": round(elapsed, 2),
            "commands_per_s": round(commands / elapsed, 1),
            "agents_enforcing": sum(1 for a in agents if a.trust.enforcing),
        }
    finally:
        for a in agents:
            a.stopped.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        lab.stop()
        shutil.rmtree(root, ignore_errors=True)


GOAL_RATIO = 0.8
"""Issue 19: accepted + done writes at least this share of the raw fsynced commit rate of the same disk."""
WARM_COMMITS = 1_200
"""More than SQLite's auto-checkpoint (1,000 pages): each write-ahead log has wrapped before the timing."""
Lanes = tuple[int, int, bool]
"""(credits, workers, pipelined): how many commands may be in flight, how many run at once, and whether the
session reads the next command while an accept is being written (the agent's, since issue 19's pipelined
accepts) or waits for each accept to be durable first (the agent before)."""
_ALL_CREDITS, _ALL_WORKERS = sum(kinds.GATEWAY_CREDITS.values()), sum(kinds.AGENT_WORKERS.values())
CONCURRENCY: dict[str, Lanes] = {
    "one_at_a_time": (1, 1, True),
    "control_lane": (kinds.GATEWAY_CREDITS["control"], kinds.AGENT_WORKERS["control"], True),
    "every_lane": (_ALL_CREDITS, _ALL_WORKERS, True),
    "every_lane_awaited_accepts": (_ALL_CREDITS, _ALL_WORKERS, False),
}
"""A fan-out's commands on one node, in the agent's shape (`agent.dispatch`: per command the session reads
the journal twice, for the duplicate rules and for BUSY, takes a credit and issues `accepted`, which its own
task awaits before the command is queued): one at a time, then as many as the control lane, or every lane,
takes. The last is the agent before pipelined accepts, for comparison: the session awaited each `accepted`
before it read the next command, so no two accepts ever shared a commit. (Before 2026-12-03's pipelining
the bench left the two reads out and had an `every_lane_accepts_at_once` shape, 14 sessions accepting at
once, which no agent ran.)"""


def raw_commit_rate(path: Path, n: int) -> float:
    """Fsynced SQLite commits a second, one small INSERT each, from a plain loop: the disk's bound."""
    conn = sqlite3.connect(str(path), isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("CREATE TABLE IF NOT EXISTS t (id INTEGER PRIMARY KEY, v BLOB)")
    payload = b"x" * 200
    t0 = time.perf_counter()
    for _ in range(n):
        conn.execute("INSERT INTO t (v) VALUES (?)", (payload,))
    elapsed = time.perf_counter() - t0
    conn.close()
    return n / elapsed


async def journal_write_rate(path: Path, n: int, lanes: Lanes = (1, 1, True), tag: str = "") -> tuple[float, float]:
    """(accepted + done writes a second, writes per fsynced transaction) for `n` commands through `lanes`.

    The dispatcher's shape: one session takes the commands in order; for each it reads the journal as the
    dispatcher does (`get_command` for the duplicate rules, `is_full` for BUSY), waits for a free credit and
    issues `accepted`, which a task of its own awaits before it queues the command (pipelined), or which the
    session awaits before the next command (not pipelined, the agent before issue 19's pipelined accepts);
    the lane's workers run each (a turn of the loop where the side effect would be) and journal `done`,
    which frees its credit. `lanes` is (credits, workers, pipelined). `tag` keeps the command ids of several
    calls on one file apart.
    """
    credits, workers, pipelined = lanes
    j = await Journal.open(path, "bench")
    body, update = b"b" * 200, b"u" * 120
    before = dataclasses.replace(j.batches.stats)
    free = asyncio.Semaphore(credits)
    queue: asyncio.Queue[str | None] = asyncio.Queue()
    accepts: set[asyncio.Task[None]] = set()

    async def accept(cid: str) -> None:
        await j.accept(Acceptance(cid, "inventory.refresh", True, False, "inc", "boot", body, time.time()))
        queue.put_nowait(cid)

    async def session() -> None:
        for i in range(n):
            cid = f"cmd{tag}-{i:06d}"
            if await j.get_command(cid) is not None or await j.is_full():
                raise RuntimeError(f"{cid}: the bench's commands are new and its journal never full")
            await free.acquire()
            if pipelined:
                task = asyncio.create_task(accept(cid))
                accepts.add(task)
                task.add_done_callback(accepts.discard)
            else:
                await accept(cid)
        while accepts:
            await asyncio.gather(*accepts)
        for _ in range(workers):
            queue.put_nowait(None)

    async def worker() -> None:
        while (cid := await queue.get()) is not None:
            await asyncio.sleep(0)  # the side effect's turn of the loop
            await j.finish(cid, update, time.time())
            free.release()

    t0 = time.perf_counter()
    await asyncio.gather(session(), *(worker() for _ in range(workers)))
    elapsed = time.perf_counter() - t0
    stats = j.batches.stats
    await j.close()
    writes = 2 * n  # accepted + done
    batched_tx, batched = stats.transactions - before.transactions, stats.members - before.members
    return writes / elapsed, writes / (writes - batched + batched_tx)


async def journal_figures(n: int = 150, rounds: int = 5) -> dict[str, Any]:
    """The journal's write rates beside the raw fsynced commit rate of the same disk, measured in pairs.

    The bench's directory follows TMPDIR (`TMPDIR=/dev/shm` measures a disk whose fsync costs nothing, so
    only the per-write overhead is left). Each shape's `n` commands run right after `2 n` raw commits, and
    its ratio is that pair's: a disk that other work keeps busy changes its fsync latency several-fold
    from one second to the next, so a bound measured apart from the figure says little. Medians and ranges
    over `rounds`.

    Both files are written untimed first, until each write-ahead log has wrapped, and a connection to each
    stays open so that no close deletes its WAL: on ext4 an fsync that grows a file commits the
    filesystem's journal too, and one that overwrites does not, so a new WAL's commits are slower than the
    rest, and a running agent's journal lives in the steady state. The raw commits fill a new WAL 1,000
    times before it wraps, the journal's (three pages a write) about 330, so without this the bound was the
    slower of the two.
    """
    root = Path(tempfile.mkdtemp(prefix="bc-bench-journal-"))
    raw: list[float] = []
    rates: dict[str, list[float]] = {c: [] for c in CONCURRENCY}
    ratios: dict[str, list[float]] = {c: [] for c in CONCURRENCY}
    per_tx: dict[str, list[float]] = {c: [] for c in CONCURRENCY}
    raw_db, journal_db = root / "raw.db", root / "journal.db"
    keepers: list[sqlite3.Connection] = []
    try:
        raw_commit_rate(raw_db, 1)
        await journal_write_rate(journal_db, 1, tag="new")
        keepers = [_keep_wal(raw_db), _keep_wal(journal_db)]
        raw_commit_rate(raw_db, WARM_COMMITS)
        await journal_write_rate(journal_db, WARM_COMMITS // 2, tag="warm")
        for r in range(rounds):
            for c, lanes in CONCURRENCY.items():
                bound = raw_commit_rate(raw_db, 2 * n)
                rate, writes_per_tx = await journal_write_rate(journal_db, n, lanes, tag=f"{r}.{c}")
                raw.append(bound)
                rates[c].append(rate)
                ratios[c].append(rate / bound)
                per_tx[c].append(writes_per_tx)
    finally:
        for k in keepers:
            k.close()
        shutil.rmtree(root, ignore_errors=True)
    out: dict[str, Any] = {
        "dir": str(root.parent),
        "raw_fsynced_commits_per_s": round(statistics.median(raw)),
        "raw_range": [round(min(raw)), round(max(raw))],
    }
    for c, (credits, workers, pipelined) in CONCURRENCY.items():
        out[c] = {
            "credits": credits,
            "workers": workers,
            "pipelined": pipelined,
            "journal_writes_per_s": round(statistics.median(rates[c])),
            "range": [round(min(rates[c])), round(max(rates[c]))],
            "writes_per_commit": round(statistics.median(per_tx[c]), 1),
            "ratio": round(statistics.median(ratios[c]), 2),
            "ratio_range": [round(min(ratios[c]), 2), round(max(ratios[c]), 2)],
        }
    return out


def _keep_wal(path: Path) -> sqlite3.Connection:
    """A connection held open for the whole run: the last one to close a WAL database deletes its WAL, and
    each measurement would then start on a new, growing one (a running agent keeps its journal open)."""
    conn = sqlite3.connect(str(path))
    conn.execute("SELECT count(*) FROM sqlite_master").fetchall()
    return conn


def journal_warnings(figures: dict[str, Any]) -> list[str]:
    """A warning line for each ratio below the goal."""
    return [
        f"WARNING: journal, {c} ({figures[c]['credits']} in flight): {figures[c]['journal_writes_per_s']:,}"
        f" writes/s, {figures[c]['ratio']:.2f} of the raw fsynced commits/s measured beside it (median; raw"
        f" {figures['raw_fsynced_commits_per_s']:,}/s) on the same disk (goal >= {GOAL_RATIO})"
        for c in CONCURRENCY
        if figures[c]["ratio"] < GOAL_RATIO
    ]
