"""Job queue figures (issue 12) for `make bench`: printed, never asserted.

1. Scheduler throughput: claims per second with `dags` × 10 trivial nodes (`Group`/`Emit`, which settle
   at their start), half the DAGs chains of 10, half fans (a `Group` root, nine `Emit`s after it).
   No template expresses such DAGs, so the bench builds the `DagSpec`s directly:
   * pure: `scheduler.step_all` in memory, every DAG submitted in one step, then one step per round
     feeding back each claimed node's `Finished`, until nothing is left;
   * persisted: the same DAGs inserted (the engine's `_insert`) and submitted in ONE store transaction
     through the engine's private `_step` (the engine starts each claimed node, which settles at once,
     and runs the next round in the same step), on a real SQLite file with the production driver
     (`SqliteStore`, aiosqlite, WAL, synchronous=FULL).
2. Dep settled → dependent started: `live` DAGs, each a chain of `Command` nodes (`inventory.refresh`
   on its own fleet node), all live at once. One sample: settle the running command's row (its own
   transaction, as a gateway does), then `engine.pass_once()`; the time from the settle's commit to the
   pass's commit, which claimed the dependent and enqueued its command. Median and p99.
3. A rolling reboot of `reboot_nodes` fake nodes with `--max-parallel 10` (the `reboot` template) over
   `bc.sim.pair` (real gateway and agents on in-memory links, the job queue as `bc serve` runs it,
   virtual time), each fake reboot taking `reboot_s` virtual seconds: virtual time vs the ideal
   (⌈nodes / 10⌉ waves × one reboot), and wall time, next to the wall time of the same pair idle for as
   long (the agents' heartbeats and reports) and the wall time spent in the engine's passes. On virtual
   time computing takes no time, so the virtual overhead is what the engine and the sessions wait on
   timers (a pass's interval, a poll): none here.

Usage: python -m bench.jobs [--part throughput|latency|reboot] [--dags 1000] [--live 100] [--samples 200]
       [--reboot-nodes 100] [--profile]
       python -m bench.run --only jobs
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import json
import logging
import pstats
import random
import shutil
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bc.control.base.bus import Bus
from bc.control.signing.signer import NullSigner
from bc.jobs import scheduler
from bc.jobs.engine import JobEngine
from bc.jobs.model import DagSpec, Dep, NodeSpec
from bc.jobs.scheduler import Event, Finished, Submit, World
from bc.jobs.views import JobRequest
from bc.store import Store
from bc.store import commands as cmd_sql
from bc.store import jobs as jobs_sql
from bc.store import nodes as nodes_sql
from bc.store.sqlite import InlineSqliteStore, SqliteStore
from bench.stats import pct

NODES_PER_DAG = 10
_SQL_WORDS = {"into", "from", "or", "ignore", "set", "where", "and", "on"}


# -- DAGs --------------------------------------------------------------------------------------


def trivial_dag(i: int) -> DagSpec:
    """Ten nodes that settle at their start: a chain (even i) or a fan (odd i)."""
    dag_id = f"b-{i:05d}"
    if i % 2 == 0:
        nodes = [NodeSpec("n0", "Group")]
        nodes += [NodeSpec(f"n{k}", "Emit", deps=(Dep(f"n{k - 1}"),)) for k in range(1, NODES_PER_DAG)]
    else:
        nodes = [NodeSpec("n0", "Group")]
        nodes += [NodeSpec(f"n{k}", "Emit", deps=(Dep("n0"),)) for k in range(1, NODES_PER_DAG)]
    return DagSpec(dag_id, "bench", tuple(nodes))


def command_chain(i: int, length: int) -> DagSpec:
    """A chain of `Command(inventory.refresh)` nodes on fleet node f<i> (leased, as templates do)."""
    subject = f"f{i:05d}"
    params = {"kind": "inventory.refresh", "payload_json": "{}"}
    nodes = [
        NodeSpec(f"c{k}", "Command", subject=subject, params=params, lease=True, deps=(Dep(f"c{k - 1}"),) if k else ())
        for k in range(length)
    ]
    return DagSpec(f"l-{i:05d}", "bench", tuple(nodes))


# -- a store on a real file ----------------------------------------------------------------------


class Bench:
    """A fresh SQLite store file (the production driver), a bus and an engine."""

    def __init__(self, prefix: str, driver: str = "aiosqlite") -> None:
        self.root = Path(tempfile.mkdtemp(prefix=prefix))
        path = self.root / "bc.db"
        self.store: Store = SqliteStore(path) if driver == "aiosqlite" else InlineSqliteStore(path)
        self.statements: Counter[str] = Counter()
        self.bus = Bus()
        self.engine = JobEngine(self.store, self.bus, NullSigner(), random.Random(7), holder="gw-bench")

    async def __aenter__(self) -> Bench:
        await self.store.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.store.close()
        shutil.rmtree(self.root, ignore_errors=True)

    def count_statements(self) -> None:
        """Count the store's statements by verb and table (instrumentation for the profile)."""
        inner = self.store._run  # type: ignore[attr-defined]

        async def counted(sql: str, params: Any, *, fetch: bool) -> Any:
            words = sql.split()
            verb = words[0].upper() if words else ""
            table = next((w for w in words[1:] if w.islower() and w.isidentifier() and w not in _SQL_WORDS), "")
            self.statements[f"{verb} {table}".strip()] += 1
            return await inner(sql, params, fetch=fetch)

        self.store._run = counted  # type: ignore[attr-defined]

    async def add_nodes(self, names: Sequence[str]) -> None:
        now_ms = await self.store.now_ms()
        async with self.store.transaction() as tx:
            for n in names:
                await nodes_sql.ensure(tx, n, "node", now_ms)
                await nodes_sql.set_connectivity(tx, n, "connected", now_ms)

    async def submit_all(self, specs: Sequence[DagSpec]) -> None:
        """Insert every DAG and submit them all in one engine step (one transaction)."""
        engine = self.engine
        now_ms = await self.store.now_ms()
        req = JobRequest("bench", ())
        async with self.store.transaction() as tx:
            held = await engine._begin(tx)  # private: no template builds these DAGs
            for spec in specs:
                await engine._insert(tx, (spec, req, "bench"), now_ms)
                held.owners[spec.id] = "bench"
            await engine._step(tx, [Submit(s) for s in specs], now_ms, held=held)


def profiled(enabled: bool) -> cProfile.Profile | None:
    if not enabled:
        return None
    p = cProfile.Profile()
    p.enable()
    return p


def report_profile(p: cProfile.Profile | None, title: str, lines: int = 25) -> None:
    if p is None:
        return
    p.disable()
    out = io.StringIO()
    pstats.Stats(p, stream=out).sort_stats("tottime").print_stats(lines)
    print(f"--- profile: {title} (sorted by own time) ---")
    print("\n".join(out.getvalue().splitlines()[4:]), flush=True)


# -- 1. throughput ---------------------------------------------------------------------------------


def pure_throughput(dags: int) -> dict[str, Any]:
    specs = [trivial_dag(i) for i in range(dags)]
    t0 = time.perf_counter()
    world, dec = scheduler.step_all(World(), [Submit(s) for s in specs])
    submit_s = time.perf_counter() - t0
    claims, rounds = len(dec.claims), 1
    while dec.claims:
        events: list[Event] = [Finished(c.dag, c.node, True) for c in dec.claims]
        world, dec = scheduler.step_all(world, events)
        claims += len(dec.claims)
        rounds += 1
    total = time.perf_counter() - t0
    assert claims == dags * NODES_PER_DAG and not world.dags, "every node claimed, every DAG settled"
    return {
        "dags": dags,
        "nodes": claims,
        "steps": rounds,
        "submit_step_s": round(submit_s, 3),
        "total_s": round(total, 3),
        "claims_per_s": round(claims / total),
    }


def pure_step_at(live: int, steps: int = 200) -> dict[str, Any]:
    """One step with one event (a node's outcome) while `live` DAGs of commands are live: the cost every
    pass pays whatever moved (the world copied, every DAG walked by the claim pass)."""
    length = steps // live + 2  # every DAG stays live throughout
    specs = [command_chain(i, length) for i in range(live)]
    world, dec = scheduler.step_all(World(), [Submit(s) for s in specs])
    running = {c.dag: c.node for c in dec.claims}
    times: list[float] = []
    for k in range(steps):
        dag_id = specs[k % live].id
        t0 = time.perf_counter()
        world, dec = scheduler.step_all(world, [Finished(dag_id, running[dag_id], True)])
        times.append((time.perf_counter() - t0) * 1000)
        running.update({c.dag: c.node for c in dec.claims})
    return {
        "live_dags": live,
        "nodes": live * length,
        "steps": steps,
        "step_median_ms": round(statistics.median(times), 3),
        "step_p99_ms": round(pct(times, 0.99), 3),
    }


async def persisted_throughput(dags: int, driver: str, profile: bool) -> dict[str, Any]:
    specs = [trivial_dag(i) for i in range(dags)]
    async with Bench("bc-bench-jobs-", driver) as b:
        b.count_statements()
        prof = profiled(profile)
        t0 = time.perf_counter()
        await b.submit_all(specs)
        total = time.perf_counter() - t0
        report_profile(prof, f"persisted engine ({driver}), {dags} DAGs x {NODES_PER_DAG} trivial nodes in one step")
        statements = b.statements.copy()
        async with b.store.transaction(write=False) as tx:
            done = await tx.fetchval("SELECT COUNT(*) FROM job_nodes WHERE state = 'done'")
            live = await tx.fetchval("SELECT COUNT(*) FROM job_dags WHERE settled_at_ms IS NULL")
    assert done == dags * NODES_PER_DAG and live == 0, (done, live)
    return {
        "driver": driver,
        "dags": dags,
        "nodes": done,
        "transactions": 1,
        "total_s": round(total, 2),
        "claims_per_s": round(int(done) / total),
        "statements_per_node": round(sum(statements.values()) / int(done), 1),
        "top_statements": dict(statements.most_common(8)),
    }


# -- 2. dep settled -> dependent started ----------------------------------------------------------------


async def running_commands(store: Store) -> dict[str, str]:
    """dag id -> its running node's command id."""
    async with store.transaction(write=False) as tx:
        rows = await tx.fetchall("SELECT dag_id, detail FROM job_nodes WHERE state = 'running'")
    return {str(r["dag_id"]): str(json.loads(str(r["detail"]))["command_id"]) for r in rows}


async def settle_command(store: Store, command_id: str) -> None:
    now_ms = await store.now_ms()
    async with store.transaction() as tx:
        row = await cmd_sql.get(tx, command_id)
        assert row is not None
        assert await cmd_sql.settle(
            tx, command_id, expected=str(row["state"]), state="succeeded", reason="", message="", now_ms=now_ms
        )


async def settle_to_start(live: int, samples: int, profile: bool) -> dict[str, Any]:
    """`live` chains of commands live at once; `samples` settles, round robin over the DAGs."""
    length = samples // live + 2
    specs = [command_chain(i, length) for i in range(live)]
    async with Bench("bc-bench-jobs-lat-") as b:
        await b.add_nodes([f"f{i:05d}" for i in range(live)])
        await b.submit_all(specs)
        running = await running_commands(b.store)
        assert len(running) == live
        lat: list[float] = []
        settle_ms: list[float] = []
        prof = profiled(profile)
        for k in range(samples):
            dag_id = specs[k % live].id
            t_settle = time.perf_counter()
            await settle_command(b.store, running[dag_id])
            t0 = time.perf_counter()
            assert await b.engine.pass_once() == 1
            lat.append((time.perf_counter() - t0) * 1000)
            settle_ms.append((t0 - t_settle) * 1000)
            if (k + 1) % live == 0:
                running = await running_commands(b.store)  # the wave's dependents, with their new command ids
        report_profile(prof, f"pass_once with {live} live DAGs")
        async with b.store.transaction(write=False) as tx:
            sent = await tx.fetchval("SELECT COUNT(*) FROM commands")
    assert sent == live + samples, (sent, live, samples)
    return {
        "live_dags": live,
        "running_nodes": live,
        "samples": samples,
        "median_ms": round(statistics.median(lat), 2),
        "p99_ms": round(pct(lat, 0.99), 2),
        "max_ms": round(max(lat), 2),
        "settle_tx_median_ms": round(statistics.median(settle_ms), 2),
    }


# -- 3. a rolling reboot over the session pair ------------------------------------------------------------


def timed(engine: JobEngine) -> dict[str, float]:
    """Wrap the engine's submit and pass: how many passes ran and the wall time spent in them."""
    spent = {"passes": 0, "s": 0.0}
    inner_pass, inner_submit = engine.pass_once, engine.submit

    async def pass_once(*, lease: bool = True) -> int:
        t0 = time.perf_counter()
        try:
            return await inner_pass(lease=lease)
        finally:
            spent["passes"] += 1
            spent["s"] += time.perf_counter() - t0

    async def submit(req: JobRequest, requested_by: str) -> str:
        t0 = time.perf_counter()
        try:
            return await inner_submit(req, requested_by)
        finally:
            spent["s"] += time.perf_counter() - t0

    engine.pass_once = pass_once  # type: ignore[method-assign]
    engine.submit = submit  # type: ignore[method-assign]
    return spent


def rolling_reboot(nodes: int, max_parallel: int, reboot_s: float) -> dict[str, Any]:
    """`bc jobs run reboot` over `nodes` fake nodes with --max-parallel, on virtual time; see the docstring."""
    from bc.jobs import queries
    from bc.seams.virtual_time import run as run_virtual
    from bc.sim.pair import PairConfig, SessionPair, _scratch_dir

    async def go(root: Path) -> dict[str, Any]:
        pair = SessionPair(root, seed=7, agents=nodes, cfg=PairConfig(reboot_s=reboot_s))
        loop = asyncio.get_running_loop()
        w_start = time.perf_counter()
        await pair.start()
        try:
            for _ in range(600):  # every agent joined and connected
                if set((await pair.connectivity()).values()) == {"connected"}:
                    break
                await asyncio.sleep(1)
            await asyncio.sleep(30)  # first status reports and heartbeats settle
            assert pair.cp is not None and pair.cp.jobs is not None
            w0, v0, ms0 = time.perf_counter(), loop.time(), await pair.store.now_ms()
            engine = pair.cp.jobs
            spent = timed(engine)
            req = JobRequest("reboot", tuple(pair.node_ids()), max_parallel=max_parallel)
            dag_id = await engine.submit(req, "bench")
            while True:  # a look at the DAG's row whenever the events log moves: cheap next to the agents
                async with pair.store.transaction(write=False) as tx:
                    row = await jobs_sql.get_dag(tx, dag_id)
                if row is not None and row["settled_at_ms"] is not None:
                    break
                await pair.cp.bus.wait_events(5.0)
            wall_s = time.perf_counter() - w0
            view = await queries.get_dag(pair.store, dag_id)
            # The same pair idle for as long: what the agents' heartbeats and reports cost without a job.
            w1, passes, engine_s = time.perf_counter(), spent["passes"], spent["s"]
            await asyncio.sleep((view.settled_at_ms - view.created_at_ms) / 1000)
            idle_wall_s, idle_passes = time.perf_counter() - w1, spent["passes"] - passes
        finally:
            await pair.stop()
        assert view.state == "done", view.state
        virtual_s = (view.settled_at_ms - view.created_at_ms) / 1000
        # Per node, on the store's (virtual) clock: the reboot command's claim -> the fake reboot's start
        # (delivery), the reboot's end -> the node settled done (result back and the engine's pass).
        hook_ms = {n: ms0 + (t - v0) * 1000 for n, t in pair.reboots}
        cmd = {x.subject: x for x in view.nodes if x.kind == "Command"}
        deliver = [hook_ms[n] - reboot_s * 1000 - cmd[n].started_at_ms for n in hook_ms]
        settle = [cmd[n].finished_at_ms - hook_ms[n] for n in hook_ms]
        waves = -(-nodes // max_parallel)
        ideal = waves * reboot_s
        return {
            "nodes": nodes,
            "max_parallel": max_parallel,
            "reboot_s": reboot_s,
            "reboots": len(pair.reboots),
            "ideal_s": ideal,
            "virtual_s": round(virtual_s, 3),
            "over_ideal_s": round(virtual_s - ideal, 3),
            "virtual_over_ideal": round(virtual_s / ideal, 4),
            "command_delivery_median_ms": round(statistics.median(deliver), 1),
            "result_to_done_median_ms": round(statistics.median(settle), 1),
            "wall_s": round(wall_s, 2),
            "engine_passes": passes,
            "engine_wall_s": round(engine_s, 3),
            "idle_same_span_wall_s": round(idle_wall_s, 2),
            "idle_engine_passes": idle_passes,
            "setup_wall_s": round(w0 - w_start, 1),
        }

    logging.disable(logging.WARNING)  # each fake reboot logs a warning, as a real one does
    try:
        with _scratch_dir() as root:
            return run_virtual(go(root))
    finally:
        logging.disable(logging.NOTSET)


# -- main ------------------------------------------------------------------------------------------------


async def run(args: argparse.Namespace) -> None:
    parts = [args.part] if args.part else ["throughput", "latency", "reboot"]
    if "throughput" in parts:
        t0 = time.perf_counter()
        print("jobs scheduler, pure step_all:", json.dumps(pure_throughput(args.dags)), flush=True)
        for live in (10, 100, 1000):
            print("jobs scheduler, one pure step:", json.dumps(pure_step_at(live)), flush=True)
        for driver in ("aiosqlite", "inline"):
            persisted = await persisted_throughput(args.dags, driver, args.profile)
            print("jobs engine, persisted (SQLite file):", json.dumps(persisted), flush=True)
        print(f"  (part wall {time.perf_counter() - t0:.1f} s)", flush=True)
    if "latency" in parts:
        t0 = time.perf_counter()
        for live in args.live:
            # Each pass checks every running node: keep the biggest load's samples within the part's minute.
            figures = await settle_to_start(live, min(args.samples, max(50, 100_000 // live)), args.profile)
            print("jobs dep settled -> dependent started:", json.dumps(figures), flush=True)
        print(f"  (part wall {time.perf_counter() - t0:.1f} s)", flush=True)
    if "reboot" in parts:
        t0 = time.perf_counter()
        figures = await asyncio.to_thread(rolling_reboot, args.reboot_nodes, 10, args.reboot_s)
        print("jobs rolling reboot (session pair):", json.dumps(figures), flush=True)
        print(f"  (part wall {time.perf_counter() - t0:.1f} s)", flush=True)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m bench.jobs")
    ap.add_argument("--part", choices=["throughput", "latency", "reboot"])
    ap.add_argument("--dags", type=int, default=1000, help="part 1: DAGs of 10 trivial nodes")
    ap.add_argument("--live", type=int, nargs="+", default=[1, 100, 1000], help="part 2: live DAGs")
    ap.add_argument("--samples", type=int, default=200, help="part 2: settles per load (at most 100,000 / live)")
    ap.add_argument("--reboot-nodes", type=int, default=100, help="part 3: fake nodes rebooted")
    ap.add_argument("--reboot-s", type=float, default=60.0, help="part 3: one fake reboot, virtual seconds")
    ap.add_argument("--profile", action="store_true", help="cProfile the persisted engine's parts")
    return ap


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.CRITICAL)
    asyncio.run(run(parser().parse_args(argv)))


if __name__ == "__main__":
    main()
