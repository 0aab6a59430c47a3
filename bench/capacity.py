"""Capacity figures (issue 13) for `make bench`: printed, never asserted.

1. Placement pass: `nodes` fake `hgx-h100-8` nodes (8 GPUs each) and `pending` reservations, in submit
   order cycling 1, 2, 4, 8 GPUs, each for one hour (so one that does not fit now waits with a bounded
   earliest start and a backfill hold):
   * pure: `placement_plan.plan` alone, in memory, run `repeats` times on the same facts;
   * wired: `PlacementPass.pass_once` on a real SQLite file (the production driver, `SqliteStore`), the
     same fleet and queue seeded through `bc/store` functions, each repeat on a fresh copy of the seeded
     file (a pass books, so the second pass over one file would place nothing). Then, on that file, the
     pass the loop runs next after one more reservation (incremental: only the new one decided), and one
     after another more that re-plans the whole queue (`full=True`, the loop's periodic pass). Then two
     `reserve` calls (what the Reserve RPC does: the insert and its inline pass): one handed that pass, as
     `bc serve` hands its loop's, one with a fresh pass, which re-plans the whole queue.
   Reservations placed per second = the `Placement`s of one pass / that pass's wall time; median, and at
   the p99 (slowest) pass, over the repeats (each repeat is one sample).
   The defaults are scaled down to keep each sub-part under a minute on two shared cores: the pass is
   about quadratic in the queue (each waiting reservation walks the booking ends, `_earliest`), and
   `--nodes 1000 --pending 10000` took 84 s for ONE pure pass (2026-12-01, 2 cores).
2. reserve -> active on an idle fleet: `bc serve` and `bc node --fake-hw hgx-h100-8` as subprocesses
   (bench.run's Lab), an Admin client reserving one GPU and watching `reservation.active` (the agent's
   `bound` report); each reservation is released (and `reservation.released` seen) before the next.
3. `bc usage`: `reservations` reservations with `hours` closed hourly windows each, seeded with plain SQL
   into `usage_windows`, then `bc.control.capacity.views.usage` (what GetUsage runs) timed once per
   `--by` mode; the full year (8,760 h) is extrapolated linearly from the scale printed.

Usage: python -m bench.capacity [--part pass|active|usage] [--nodes 400] [--pending 4000] [--repeats 3]
       [--wired-nodes 200] [--wired-pending 2000] [--wired-repeats 2] [--reservations-n 50]
       [--usage-reservations 1000] [--usage-hours 876] [--profile]
       python -m bench.run --only capacity
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import json
import pstats
import random
import shutil
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from google.protobuf.json_format import MessageToJson

from agent.hw.base import inventory_hash
from agent.hw.fake import FakeHardware
from bc.control.base.bus import Bus
from bc.control.capacity import views as capacity_views
from bc.control.capacity.placement_pass import PlacementPass, node_info
from bc.control.capacity.placement_plan import NodeInfo, Placement, Request, Wait, plan
from bc.control.capacity.reservations import ReserveRequest, reserve
from bc.control.capacity.usage_windows import BY, HOUR_MS
from bc.control.signing.signer import NullSigner
from bc.store import Tx
from bc.store import capacity as cap_sql
from bc.store import nodes as nodes_sql
from bc.store.sqlite import SqliteStore
from bench.stats import pct

PROFILE = "hgx-h100-8"
SIZES = (1, 2, 4, 8)
YEAR_H = 8760


def spread(samples: Sequence[float], nd: int = 1) -> dict[str, float]:
    return {"median": round(statistics.median(samples), nd), "p99": round(pct(samples, 0.99), nd)}


def rate_spread(placed: int, times_ms: Sequence[float]) -> dict[str, float]:
    """Placements per second of a pass: median over the passes, and at the p99 (slowest) pass."""
    return {
        "median": round(placed * 1000 / statistics.median(times_ms)),
        "p99": round(placed * 1000 / pct(times_ms, 0.99)),
    }


def report_profile(p: cProfile.Profile, title: str, lines: int = 25) -> None:
    out = io.StringIO()
    pstats.Stats(p, stream=out).sort_stats("cumulative").print_stats(lines)
    print(f"--- profile: {title} (sorted by cumulative time) ---")
    print("\n".join(out.getvalue().splitlines()[4:]), flush=True)


# -- 1. the placement pass --------------------------------------------------------------------------


def inventory_json(node_id: str) -> str:
    inv = FakeHardware(PROFILE, node_id).inventory()
    return str(MessageToJson(inv, preserving_proto_field_name=True))


def fleet(n: int) -> list[NodeInfo]:
    """`n` connected nodes with the fake profile's inventory, through the pass's own row-to-facts code."""
    out = []
    for i in range(n):
        nid = f"n{i:05d}"
        row = {"node_id": nid, "inventory": inventory_json(nid), "connectivity": "connected", "cordoned": 0}
        out.append(node_info({**row, "revoked": 0}))
    return out


def queue(n: int) -> list[Request]:
    return [Request(f"r{i:06d}", i + 1, SIZES[i % len(SIZES)], duration_ms=HOUR_MS) for i in range(n)]


def tally(outcomes: Sequence[object]) -> dict[str, int]:
    placed = sum(1 for o in outcomes if isinstance(o, Placement))
    held = sum(1 for o in outcomes if isinstance(o, Wait) and o.held is not None)
    waiting = sum(1 for o in outcomes if isinstance(o, Wait))
    return {"placed": placed, "waiting": waiting, "waiting_with_hold": held, "failed": len(outcomes) - placed - waiting}


def pure_pass(nodes: int, pending: int, repeats: int, profile: bool) -> dict[str, Any]:
    facts, reqs = fleet(nodes), queue(pending)
    now_ms = 1_800_000_000_000
    times: list[float] = []
    counts: dict[str, int] = {}
    prof = cProfile.Profile() if profile else None
    for _ in range(repeats):
        t0 = time.perf_counter()
        if prof:
            prof.enable()
        p = plan(facts, [], reqs, now_ms)
        if prof:
            prof.disable()
        dt = time.perf_counter() - t0
        counts = tally(p.outcomes)
        times.append(dt * 1000)
    if prof:
        report_profile(prof, f"pure plan, {nodes} nodes x 8 GPUs, {pending} pending")
    return {
        "nodes": nodes,
        "gpus": nodes * 8,
        "pending": pending,
        "repeats": repeats,
        **counts,
        "pass_ms": spread(times),
        "placed_per_s": rate_spread(counts["placed"], times),
    }


async def add_pending(tx: Tx, i: int, now_ms: int) -> None:
    """Reservation `r{i:06d}` of the bench's queue: 1, 2, 4 or 8 GPUs in turn, one hour, no window."""
    await cap_sql.insert_pending(
        tx,
        id_=f"r{i:06d}",
        allocation_id=f"a{i:06d}",
        want_node_id=None,
        device_class="gpu",
        gpus=SIZES[i % len(SIZES)],
        binding="hold",
        start_ms=None,
        end_ms=None,
        duration_ms=HOUR_MS,
        tenant=f"t{i % 10}",
        selector_json="{}",
        cpus=0,
        memory_bytes=0,
        hugepages_1g=0,
        now_ms=now_ms,
    )


async def seed_store(path: Path, nodes: int, pending: int) -> float:
    t0 = time.perf_counter()
    store = SqliteStore(path)
    await store.open()
    try:
        now_ms = await store.now_ms()
        async with store.transaction() as tx:
            for i in range(nodes):
                nid = f"n{i:05d}"
                await nodes_sql.ensure(tx, nid, "node", now_ms)
                await nodes_sql.set_connectivity(tx, nid, "connected", now_ms)
                inv = FakeHardware(PROFILE, nid).inventory()
                await nodes_sql.write_inventory(
                    tx, nid, MessageToJson(inv, preserving_proto_field_name=True), inventory_hash(inv)
                )
        async with store.transaction() as tx:
            for i in range(pending):
                await add_pending(tx, i, now_ms)
    finally:
        await store.close()
    return time.perf_counter() - t0


async def wired_pass(nodes: int, pending: int, repeats: int, profile: bool) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="bc-bench-cap-"))
    try:
        seed = root / "seed.db"
        seed_s = await seed_store(seed, nodes, pending)
        times: list[float] = []
        next_times: list[float] = []
        full_times: list[float] = []
        reserve_kept: list[float] = []
        reserve_fresh: list[float] = []
        incremental: list[bool] = []
        counts: dict[str, int] = {}
        prof = cProfile.Profile() if profile else None
        for k in range(repeats):
            run = root / f"run{k}.db"
            shutil.copy(seed, run)
            store = SqliteStore(run)
            await store.open()
            try:
                p = PlacementPass(store, Bus(), NullSigner(), random.Random(7), holder="gw-bench")
                t0 = time.perf_counter()
                if prof and k == 0:
                    prof.enable()
                res = await p.pass_once(lease=False)
                if prof and k == 0:
                    prof.disable()
                dt = time.perf_counter() - t0
                # The pass the loop runs next, on news (one more reservation): the fleet as the first pass
                # left it, its thousands still waiting, so what a steady fleet pays for each change.
                async with store.transaction() as tx:
                    await add_pending(tx, pending, await store.now_ms())
                t1 = time.perf_counter()
                nxt = await p.pass_once(lease=False)
                next_times.append((time.perf_counter() - t1) * 1000)
                assert nxt is not None
                incremental.append(nxt.incremental)
                # The same again re-planning the whole queue, as the loop's periodic pass does (every 5 s).
                async with store.transaction() as tx:
                    await add_pending(tx, pending + 1, await store.now_ms())
                t2 = time.perf_counter()
                await p.pass_once(lease=False, full=True)
                full_times.append((time.perf_counter() - t2) * 1000)
                # A `bc reserve` (the RPC's work: insert and the inline pass): handed the process's pass, as `bc
                # serve` does, it goes on from the last; a fresh pass re-plans the whole queue.
                bus, want = Bus(), ReserveRequest(gpus=1)
                t3 = time.perf_counter()
                await reserve(store, bus, NullSigner(), want, random.Random(k), placement=p)
                reserve_kept.append((time.perf_counter() - t3) * 1000)
                t4 = time.perf_counter()
                await reserve(store, bus, NullSigner(), want, random.Random(k + 100))
                reserve_fresh.append((time.perf_counter() - t4) * 1000)
            finally:
                await store.close()
            run.unlink()
            assert res is not None
            counts = tally(res.plan.outcomes)
            times.append(dt * 1000)
        if prof:
            report_profile(prof, f"wired pass, {nodes} nodes, {pending} pending (SQLite file)")
        return {
            "nodes": nodes,
            "pending": pending,
            "repeats": repeats,
            "seed_s": round(seed_s, 1),
            **counts,
            "pass_ms": spread(times),
            "next_pass_after_one_new_ms": spread(next_times),
            "next_pass_incremental": all(incremental),
            "full_pass_after_one_more_ms": spread(full_times),
            "reserve_with_the_process_pass_ms": spread(reserve_kept),
            "reserve_with_a_fresh_pass_ms": spread(reserve_fresh),
            "placed_per_s": rate_spread(counts["placed"], times),
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)


# -- 2. reserve -> active ---------------------------------------------------------------------------


async def reserve_to_active(n: int) -> dict[str, Any]:
    from agent.join import join_node
    from bench.run import Lab

    root = Path(tempfile.mkdtemp(prefix="bc-bench-act-"))
    lab = Lab(root)
    try:
        await lab.serve()
        async with lab.admin() as admin:
            tok = await admin.create_token("n1")
            await join_node(lab.address, tok.token, root / "n1")
            lab.spawn("n1", "node", "--data-dir", str(root / "n1"), "--fake-hw", PROFILE)
            events: asyncio.Queue[tuple[str, str, float]] = asyncio.Queue()
            info = await admin.server_info()

            async def follow() -> None:
                async for ev in admin.watch(after_seq=info.event_seq, type_prefix="reservation."):
                    events.put_nowait((ev.type, ev.subject, time.perf_counter()))

            async def seen(kind: str, rid: str) -> float:
                while True:
                    typ, subject, at = await asyncio.wait_for(events.get(), 30)
                    if typ == kind and subject == rid:
                        return at

            watcher = asyncio.create_task(follow())
            for _ in range(600):  # the node's first report: it offers its GPUs
                if any(x.state == "connected" and x.observed_generation >= 1 for x in await admin.list_nodes()):
                    break
                await asyncio.sleep(0.05)
            samples, placed_ms = [], []
            for _ in range(n):
                t0 = time.perf_counter()
                res = await admin.reserve(1)
                placed_ms.append((time.perf_counter() - t0) * 1000)
                at = await seen("reservation.active", res.id)
                samples.append((at - t0) * 1000)
                await admin.release(res.id)
                await seen("reservation.released", res.id)
            watcher.cancel()
        return {
            "reservations": n,
            "reserve_rpc_ms": spread(placed_ms),
            "reserve_to_active_ms": spread(samples),
            "min_ms": round(min(samples), 1),
            "max_ms": round(max(samples), 1),
        }
    finally:
        lab.stop()
        shutil.rmtree(root, ignore_errors=True)


# -- 3. bc usage ------------------------------------------------------------------------------------


async def usage_figures(reservations: int, hours: int, profile: bool) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="bc-bench-use-"))
    path = root / "bc.db"
    try:
        store = SqliteStore(path)
        await store.open()  # migrations
        await store.close()
        t0 = time.perf_counter()
        start = 1_767_225_600_000  # 2026-01-01T00:00Z
        db = sqlite3.connect(path)
        db.execute("PRAGMA foreign_keys=OFF")
        db.executemany(
            "INSERT INTO reservations (id, seq, allocation_id, device_class, gpus, binding, state, created_at_ms,"
            " tenant, selector, node_id, ended_at_ms) VALUES (?, ?, ?, 'gpu', ?, 'hold', 'released', ?, ?, '{}', ?, ?)",
            [
                (
                    f"r{i:06d}",
                    i + 1,
                    f"a{i:06d}",
                    SIZES[i % 4],
                    start,
                    f"t{i % 10}",
                    f"n{i % 1000:05d}",
                    start + hours * HOUR_MS,
                )
                for i in range(reservations)
            ],
        )
        for i in range(reservations):
            rid, node, tenant, atoms = f"r{i:06d}", f"n{i % 1000:05d}", f"t{i % 10}", SIZES[i % 4]
            db.executemany(
                "INSERT INTO usage_windows (reservation_id, start_ms, end_ms, node_id, tenant, device_class, atoms)"
                " VALUES (?, ?, ?, ?, ?, 'gpu', ?)",
                [(rid, start + h * HOUR_MS, start + (h + 1) * HOUR_MS, node, tenant, atoms) for h in range(hours)],
            )
        db.commit()
        db.close()
        seed_s = time.perf_counter() - t0
        rows = reservations * hours
        store = SqliteStore(path)
        await store.open()
        by_mode: dict[str, Any] = {}
        try:
            for by in BY:
                prof = cProfile.Profile() if profile and by == "reservation" else None
                t0 = time.perf_counter()
                if prof:
                    prof.enable()
                out, _ = await capacity_views.usage(store, None, None, by)
                if prof:
                    prof.disable()
                dt = time.perf_counter() - t0
                if prof:
                    report_profile(prof, f"bc usage --by reservation, {rows} windows")
                by_mode[by] = {
                    "s": round(dt, 2),
                    "rows_out": len(out),
                    "windows_per_s": round(rows / dt),
                    "year_extrapolated_s": round(dt * YEAR_H / hours, 1),
                }
        finally:
            await store.close()
        return {
            "reservations": reservations,
            "hours": hours,
            "windows": rows,
            "scale_of_year": round(hours / YEAR_H, 3),
            "seed_s": round(seed_s, 1),
            "db_mib": round(path.stat().st_size / 2**20, 1),
            "by": by_mode,
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)


# -- driver -----------------------------------------------------------------------------------------


async def run(args: argparse.Namespace) -> None:
    if args.part in (None, "pass"):
        t0 = time.perf_counter()
        figures = await asyncio.to_thread(pure_pass, args.nodes, args.pending, args.repeats, args.profile)
        print("capacity placement pass, pure plan:", json.dumps(figures), flush=True)
        print(f"  (part wall {time.perf_counter() - t0:.1f} s)", flush=True)
        t0 = time.perf_counter()
        figures = await wired_pass(args.wired_nodes, args.wired_pending, args.wired_repeats, args.profile)
        print("capacity placement pass, wired (SQLite file):", json.dumps(figures), flush=True)
        print(f"  (part wall {time.perf_counter() - t0:.1f} s)", flush=True)
    if args.part in (None, "active"):
        t0 = time.perf_counter()
        figures = await reserve_to_active(args.reservations_n)
        print("capacity reserve -> active (bc serve + bc node subprocesses):", json.dumps(figures), flush=True)
        print(f"  (part wall {time.perf_counter() - t0:.1f} s)", flush=True)
    if args.part in (None, "usage"):
        t0 = time.perf_counter()
        figures = await usage_figures(args.usage_reservations, args.usage_hours, args.profile)
        print("capacity bc usage (capacity_views.usage):", json.dumps(figures), flush=True)
        print(f"  (part wall {time.perf_counter() - t0:.1f} s)", flush=True)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m bench.capacity")
    ap.add_argument("--part", choices=["pass", "active", "usage"])
    ap.add_argument("--nodes", type=int, default=400, help="part 1 pure: fake 8-GPU nodes")
    ap.add_argument("--pending", type=int, default=4000, help="part 1 pure: pending reservations")
    ap.add_argument("--repeats", type=int, default=3, help="part 1 pure: passes timed")
    ap.add_argument("--wired-nodes", type=int, default=200, help="part 1 wired: nodes in the store")
    ap.add_argument("--wired-pending", type=int, default=2000, help="part 1 wired: pending in the store")
    ap.add_argument("--wired-repeats", type=int, default=2, help="part 1 wired: passes, each on a fresh copy")
    ap.add_argument("--reservations-n", type=int, default=50, help="part 2: reserve/release cycles")
    ap.add_argument("--usage-reservations", type=int, default=1000, help="part 3: reservations")
    ap.add_argument("--usage-hours", type=int, default=876, help="part 3: hourly windows each (a year: 8760)")
    ap.add_argument("--profile", action="store_true", help="cProfile the pure plan, the wired pass and usage")
    return ap


def main(argv: list[str] | None = None) -> None:
    asyncio.run(run(parser().parse_args(argv)))


if __name__ == "__main__":
    main()
