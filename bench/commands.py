"""Command figures for `make bench`.

1. End-to-end commands per second: `inventory.refresh` enqueued through the
   Admin API until every one is SUCCEEDED, against 1, 10 and 100 nodes. `bc
   serve` is a subprocess; the agents share the bench's process (the issue
   allows it) and each keeps its own fsynced journal.
2. The agent journal's `accepted` + `done` writes per second next to the raw
   fsynced SQLite commit rate of the same disk, measured in the same run: the
   ratio says how close the journal runs to the disk's limit.

`bc serve` runs with whatever flags the caller passes (`serve_args`; none by
default, so a new install signs commands): `bench.signing` uses that to run
the same workload with `--command-signing off` and `on`.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import sqlite3
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agent.app import Agent, AgentOptions
from agent.join import join_node
from agent.journal import Journal
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


def raw_commit_rate(path: Path, n: int) -> float:
    conn = sqlite3.connect(str(path), isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v BLOB)")
    payload = b"x" * 200
    t0 = time.perf_counter()
    for _ in range(n):
        conn.execute("INSERT INTO t (v) VALUES (?)", (payload,))
    elapsed = time.perf_counter() - t0
    conn.close()
    return n / elapsed


async def journal_write_rate(path: Path, n: int) -> float:
    j = await Journal.open(path, "bench")
    body, update = b"b" * 200, b"u" * 120
    t0 = time.perf_counter()
    for i in range(n):
        cid = f"cmd-{i:06d}"
        await j.accept(cid, "inventory.refresh", True, False, "inc", "boot", body, time.time())
        await j.finish(cid, update, time.time())
    elapsed = time.perf_counter() - t0
    await j.close()
    return 2 * n / elapsed  # accepted + done


async def journal_figures(n: int = 500) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="bc-bench-journal-"))
    try:
        raw = raw_commit_rate(root / "raw.db", 2 * n)
        journal = await journal_write_rate(root / "journal.db", n)
        return {
            "raw_fsynced_commits_per_s": round(raw),
            "journal_writes_per_s": round(journal),
            "ratio": round(journal / raw, 2),
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)
