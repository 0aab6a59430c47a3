"""The provisioning job's own cost (docs/metal.md, "Figures"): `python -m bench.metal [--machines 100]
[--max-parallel 10] [--driver aiosqlite|inline]`.

N machines behind one site are enrolled and provisioned in one `metal.provision` job on a fresh SQLite store
(the production driver by default); the site and the machines are played at their edge, at once (every
pending command succeeds, every awaited ramdisk and OS joins with the token the job minted, with one disk),
so what is measured is the control plane: the engine's passes, the job's rows and commands, per machine.
Printed, never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import tempfile
import time
from pathlib import Path

from google.protobuf.json_format import MessageToJson

from bc.control.base.actor import Caller
from bc.control.base.bus import Bus
from bc.control.metal import machines
from bc.control.metal import plan as metal_plan
from bc.control.signing.signer import NullSigner
from bc.control.trust.identity import TokenMint
from bc.jobs import queries
from bc.jobs.engine import JobEngine
from bc.jobs.metal_template import TEMPLATE
from bc.jobs.views import JobRequest
from bc.pki.secrets_source import SeededSecrets
from bc.protocol.pb import common_pb2
from bc.seams.clock import SystemClock
from bc.store import Store
from bc.store import commands as cmd_sql
from bc.store import nodes as nodes_sql
from bc.store.sqlite import InlineSqliteStore, SqliteStore

INVENTORY = MessageToJson(
    common_pb2.Inventory(disks=[common_pb2.Disk(name="vda", size_bytes=1 << 30)]), preserving_proto_field_name=True
)


async def play(store: Store, dag_id: str) -> int:
    """Answer what the job waits for; how many things were answered."""
    acted = 0
    now_ms = await store.now_ms()
    async with store.transaction() as tx:
        for c in await tx.fetchall("SELECT id, state FROM commands WHERE state = 'pending'", {}):
            await cmd_sql.settle(
                tx, str(c["id"]), expected="pending", state="succeeded", reason="", message="", now_ms=now_ms
            )
            acted += 1
        rows = await tx.fetchall(
            "SELECT id FROM job_nodes WHERE dag_id = :d AND state = 'running' AND kind = 'MetalJoin'", {"d": dag_id}
        )
        for r in rows:
            step, machine = str(r["id"]).split(":", 1)
            node, role = (f"{machine}-ramdisk", "ramdisk") if step == "ramdisk" else (machine, "node")
            await tx.execute(
                "UPDATE join_tokens SET used_at_ms = :t WHERE node_id = :n AND used_at_ms IS NULL",
                {"t": now_ms, "n": node},
            )
            await nodes_sql.ensure(tx, node, role, now_ms)
            await nodes_sql.set_connectivity(tx, node, "connected", now_ms)
            if role == "ramdisk":
                await nodes_sql.write_inventory(tx, node, INVENTORY, "bench")
            acted += 1
    return acted


async def run(n: int, parallel: int, driver: str) -> None:
    root = Path(tempfile.mkdtemp(prefix="bench-metal-"))
    clock = SystemClock()
    store: Store = SqliteStore(root / "bc.db") if driver == "aiosqlite" else InlineSqliteStore(root / "bc.db", clock)
    await store.open()
    try:
        bus = Bus()
        mint = TokenMint("sha256:" + "0" * 64, clock, SeededSecrets(1))
        engine = JobEngine(store, bus, NullSigner(), random.Random(7), holder="bench", tokens=mint)
        now_ms = await store.now_ms()
        async with store.transaction() as tx:
            await nodes_sql.ensure(tx, "s1", "site", now_ms)
        names = tuple(f"m{i:04d}" for i in range(n))
        started = time.perf_counter()
        for i, name in enumerate(names):
            await machines.enroll(
                store,
                bus,
                NullSigner(),
                random.Random(i),
                Caller("bench", "admin"),
                name=name,
                site_node="s1",
                bmc_url=f"http://10.{i // 250}.{i % 250}.1",
                macs=[f"52:54:00:00:{i // 256:02x}:{i % 256:02x}"],
            )
        enrolled = time.perf_counter() - started
        req = metal_plan.Request(
            machines=names,
            image="http://10.9.0.2/os.raw",
            sha256="ab" * 32,
            ramdisk_kernel_sha256="11" * 32,
            ramdisk_initrd_sha256="22" * 32,
        )
        plans = await machines.plans(store, req)
        started = time.perf_counter()
        dag_id = await engine.submit(
            JobRequest(TEMPLATE, names, max_parallel=parallel, metal_json=json.dumps([p.params() for p in plans])),
            "bench",
        )
        submitted = time.perf_counter() - started
        passes = 0
        while not (await queries.get_dag(store, dag_id)).terminal:
            await play(store, dag_id)
            await engine.pass_once()
            passes += 1
        took = time.perf_counter() - started
        view = await queries.get_dag(store, dag_id)
        async with store.transaction(write=False) as tx:
            sent = int(await tx.fetchval("SELECT COUNT(*) FROM commands", {}) or 0)
        print(f"driver {driver}, {n} machines, --max-parallel {parallel or 'all'}: job {view.state}")
        print(f"  enroll (row + signed site section each): {enrolled / n * 1000:.1f} ms a machine")
        print(f"  submit ({len(view.nodes)} job nodes): {submitted * 1000:.0f} ms")
        print(
            f"  provision, edge answering at once: {took:.2f} s, {passes} passes, {sent} commands,"
            f" {took / n * 1000:.1f} ms a machine"
        )
    finally:
        await store.close()
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--machines", type=int, default=100)
    ap.add_argument("--max-parallel", type=int, default=10)
    ap.add_argument("--driver", choices=("aiosqlite", "inline"), default="aiosqlite")
    args = ap.parse_args()
    asyncio.run(run(args.machines, args.max_parallel, args.driver))


if __name__ == "__main__":
    main()
