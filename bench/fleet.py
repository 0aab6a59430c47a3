"""`make bench-fleet`: a fleet of N nodes on G gateways over PostgreSQL, and issue 38's figures it enables.

    python -m bench.fleet [--nodes 1000] [--gateways 3] [--agent-procs 2] [--control 3] [--window 30]
                          [--settle 15] [--url postgresql://postgres@127.0.0.1:5432/test]

G `bc serve` processes share one PostgreSQL schema (`bench.rehome.start_gateways`); N nodes are joined
(`bench.rehome.join_fleet`) and held by the fleet generator (`bench.fleet_gen`: the production agent's
session core and journal rules over real gRPC and mutual TLS, fake hardware, memory journal) in K processes,
plus C full `bc node --fake-hw` processes among them as a control (their own fsynced journal, health and
telemetry loops: what a real host runs). Then, in this order, on the same fleet:

1. *Steady state, heartbeats only.* Once every node is connected in the store, wait `--settle` s, then over
   `--window` s: the gateways' CPU per session-second (/proc/PID/stat) and their memory per session (RSS
   with the sessions minus RSS before the first, /proc/PID/status), beside the generator's own CPU per
   session-second (`getrusage` in each generator process) and the control nodes' (one session each).
2. *`bc nodes --json` at the fleet size*: the CLI as an operator runs it (a new process), median of 3.
3. *Reconnect storm*: every generated session ended at once (`bench.fleet_gen`'s `storm`); the time until
   all are welcomed again (and until the store lists them connected), the refusals with a retry-after the
   agents saw and the gateways counted (`event=gateway.stats streams_refused`), and the sessions given up
   for good (must be 0).
4. *Re-home after killing 1 of the G gateways* (`bench.rehome.rehome_after_kill`): p50 / p99 / max.

Each figure is printed with the core count and the run queue when it was taken (`bench.fleet_figures`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

from bc.client.admin import AdminClient
from bc.gateway.counters import STATS_EVERY_S
from bc.runtime.config import OperatorConfig
from bc.store.postgres import drop_schema
from bench.cli_start import _time
from bench.fleet_figures import (
    Load,
    figure_line,
    kib_per_session,
    last_gateway_stats,
    parse_loadavg,
    per_session_second_ms,
    sessions_per_core,
    summed,
)
from bench.light_agents import PROFILE
from bench.pg_drivers import PG_URL
from bench.rehome import (
    agent_procs_ready,
    join_fleet,
    rehome_after_kill,
    spawn_agent_procs,
    start_gateways,
    store_connected,
)
from bench.run import Lab, free_port, rss_kib
from bench.throughput import cpu_s


def load_now() -> Load:
    return parse_loadavg(Path("/proc/loadavg").read_text(), os.cpu_count() or 1)


class Fleet:
    """The running parts: gateways, generator processes, control nodes; and how to ask each for its figures."""

    def __init__(self, root: Path, lab: Lab, gateways: int) -> None:
        self.root, self.lab, self.gateways = root, lab, gateways
        self.procs: dict[str, Any] = {}

    def gw_pids(self) -> dict[str, int]:
        return {f"gw-{g}": self.procs[f"gw-{g}"].pid for g in range(self.gateways) if f"gw-{g}" in self.procs}

    def gens(self) -> list[asyncio.subprocess.Process]:
        return [p for name, p in self.procs.items() if name.startswith("agents-")]

    def control_pids(self) -> list[int]:
        return [p.pid for name, p in self.procs.items() if name.startswith("node-")]

    async def ask(self, line: str) -> list[dict[str, Any]]:
        """One line to every generator process at once; each one's JSON answer."""
        gens = self.gens()
        for p in gens:
            assert p.stdin is not None
            p.stdin.write(f"{line}\n".encode())
            await p.stdin.drain()

        async def answer(p: asyncio.subprocess.Process) -> dict[str, Any]:
            assert p.stdout is not None
            doc: dict[str, Any] = json.loads(await p.stdout.readline())
            return doc

        return list(await asyncio.gather(*(answer(p) for p in gens)))

    def refused_by_gateways(self) -> int:
        return sum(
            last_gateway_stats((self.root / f"gw-{g}.log").read_text(errors="replace")).get("streams_refused", 0)
            for g in range(self.gateways)
        )

    async def stop(self) -> None:
        for p in self.gens():
            if p.stdin is not None and p.returncode is None:
                try:
                    p.stdin.write(b"stop\n")
                    await p.stdin.drain()
                except ConnectionError:
                    pass
            await p.wait()
        self.lab.stop()


async def steady_state(fleet: Fleet, sessions: int, control: int, settle_s: float, window_s: float) -> dict[str, Any]:
    """Heartbeats only: the gateways', the generator's and the control nodes' CPU per session-second, and the
    gateways' memory per session, over `window_s` after `settle_s` of quiet."""
    await asyncio.sleep(settle_s)
    gw0 = {n: cpu_s(pid) for n, pid in fleet.gw_pids().items()}
    ctl0 = {pid: cpu_s(pid) for pid in fleet.control_pids()}
    gen0 = await fleet.ask("cpu")
    t0 = time.monotonic()
    await asyncio.sleep(window_s)
    gen1 = await fleet.ask("cpu")
    gw1 = {n: cpu_s(pid) for n, pid in fleet.gw_pids().items()}
    ctl1 = {pid: cpu_s(pid) for pid in fleet.control_pids()}
    window = time.monotonic() - t0
    generated = int(summed(gen1, "connected"))
    gw_cpu = sum(gw1[n] - gw0[n] for n in gw0)
    gen_cpu = summed(gen1, "cpu_s") - summed(gen0, "cpu_s")
    ctl_cpu = [ctl1[p] - ctl0[p] for p in ctl0]
    server_ms = per_session_second_ms(gw_cpu, sessions, window)
    return {
        "window_s": round(window, 1),
        "sessions": sessions,
        "server_ms_per_session_s": round(server_ms, 4),
        "server_sessions_per_core": sessions_per_core(server_ms),
        "server_cpu_pct_of_a_core_per_gateway": [round(100 * (gw1[n] - gw0[n]) / window) for n in sorted(gw0)],
        "generator_ms_per_session_s": round(per_session_second_ms(gen_cpu, generated, window), 4),
        "generator_procs_cpu_pct_of_a_core": [
            round(100 * (b["cpu_s"] - a["cpu_s"]) / window) for a, b in zip(gen0, gen1, strict=True)
        ],
        "control_ms_per_session_s": [round(per_session_second_ms(c, 1, window), 4) for c in ctl_cpu],
        "control_nodes": control,
    }


def memory(fleet: Fleet, baseline_kib: dict[str, int], sessions: int) -> dict[str, Any]:
    rss = {n: rss_kib(pid) for n, pid in fleet.gw_pids().items()}
    return {
        "gateway_rss_mib": {n: round(v / 1024, 1) for n, v in sorted(rss.items())},
        "gateway_rss_before_sessions_mib": {n: round(v / 1024, 1) for n, v in sorted(baseline_kib.items())},
        "kib_per_session": round(kib_per_session(sum(rss.values()), sum(baseline_kib.values()), sessions), 1),
    }


async def nodes_json(fleet: Fleet, runs: int = 3) -> dict[str, Any]:
    """`bc nodes --json` as an operator runs it: a new process each time; the median wall and CPU seconds."""
    env = dict(fleet.lab.env, BC_CONFIG=str(fleet.root / "server" / "operator" / "config.json"))
    argv = [fleet.lab.bc, "nodes", "--json"]
    timed = [await asyncio.to_thread(_time, argv, env) for _ in range(runs)]
    return {
        "bc_nodes_json_s": round(statistics.median(w for w, _ in timed), 3),
        "bc_nodes_json_cpu_s": round(statistics.median(c for _, c in timed), 3),
        "runs": runs,
    }


async def storm(fleet: Fleet, admin: AdminClient, sessions: int) -> dict[str, Any]:
    """Every generated session ended at once: the time until all are back, and the refusals on the way."""
    refused0 = fleet.refused_by_gateways()
    before = await fleet.ask("cpu")
    t0 = time.monotonic()
    after = await fleet.ask("storm")
    if any(d["back_s"] < 0 for d in after):
        return {"all_back_s": None, "connected": int(summed(after, "connected")), "of": int(summed(after, "agents"))}
    back_s = max(d["back_s"] for d in after)
    await store_connected(admin, sessions)
    in_store_s = time.monotonic() - t0
    await asyncio.sleep(STATS_EVERY_S + 1)  # the gateways' next stats lines count the storm's refusals
    return {
        "all_back_s": round(back_s, 2),
        "all_connected_in_store_s": round(in_store_s, 2),
        "refused_retry_after_seen_by_agents": int(
            summed(after, "refused_retry_after") - summed(before, "refused_retry_after")
        ),
        "closed_or_refused_seen_by_agents": int(
            summed(after, "closed_or_refused") - summed(before, "closed_or_refused")
        ),
        "streams_refused_by_gateways": fleet.refused_by_gateways() - refused0,
        "refused_for_good": int(summed(after, "refused_for_good")),
    }


async def connected_within(admin: AdminClient, total: int, timeout_s: float, fleet: Fleet) -> None:
    """Every node connected in the store within `timeout_s`, with progress every 10 s; else a SystemExit that
    says how far the fleet got and how the gateways closed the streams that did not make it."""
    t0 = time.monotonic()
    waiting = asyncio.create_task(store_connected(admin, total))
    while not waiting.done():
        await asyncio.wait([waiting], timeout=10.0)
        up = sum(1 for n in await admin.list_nodes() if n.state == "connected")
        elapsed = time.monotonic() - t0
        print(f"  {up}/{total} connected in the store after {elapsed:.0f} s {load_now().note()}", flush=True)
        if not waiting.done() and elapsed > timeout_s:
            waiting.cancel()
            closes = closes_by_code(fleet)
            raise SystemExit(f"did not converge: {up}/{total} connected after {elapsed:.0f} s; the closes: {closes}")
    await agent_procs_ready(fleet.procs)


def closes_by_code(fleet: Fleet) -> dict[str, int]:
    """The gateways' `event=session.closed` lines by code and the first words of their details."""
    out: dict[str, int] = {}
    for g in range(fleet.gateways):
        for line in (fleet.root / f"gw-{g}.log").read_text(errors="replace").splitlines():
            if "event=session.closed" in line and " code=" in line:
                key = " ".join(line.split(" code=", 1)[1].split()[:4])
                out[key] = out.get(key, 0) + 1
    return out


def show(name: str, doc: dict[str, Any], load: Load) -> None:
    print(figure_line(name, json.dumps(doc), load), flush=True)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="bc-bench-fleet-"))
    schema = "bench_" + secrets.token_hex(4)
    lab = Lab(root)
    addrs = [lab.address, *(f"127.0.0.1:{free_port()}" for _ in range(args.gateways - 1))]
    fleet = Fleet(root, lab, args.gateways)
    total = args.nodes + args.control
    out: dict[str, Any] = {"nodes": args.nodes, "control": args.control, "gateways": args.gateways}
    print(f"  data dirs and logs in {root}; {os.cpu_count()} cores", flush=True)
    try:
        fleet.procs.update(await start_gateways(lab, root, f"{args.url}?schema={schema}", addrs))
        cfg = OperatorConfig.load(root / "server" / "operator" / "config.json")
        async with AdminClient(cfg, timeout_s=120) as admin:
            joined_s, rates = await join_fleet(admin, root, addrs, range(total))
            out["join"] = {"joined_s": round(joined_s, 1), **rates}
            baseline = {n: rss_kib(pid) for n, pid in fleet.gw_pids().items()}
            t_connect = time.monotonic()
            fleet.procs.update(
                await spawn_agent_procs(root, args.nodes, args.agent_procs, args.start_rate, "bench.fleet_gen")
            )
            for i in range(args.nodes, total):
                d = root / f"r{i:05d}"
                fleet.procs[f"node-{i}"] = lab.spawn(f"node-{i}", "node", "--data-dir", str(d), "--fake-hw", PROFILE)
            await connected_within(admin, total, args.connect_timeout, fleet)
            out["connect"] = {"all_connected_s": round(time.monotonic() - t_connect, 1)}
            show("connect", out["connect"], load_now())

            out["steady"] = await steady_state(fleet, total, args.control, args.settle, args.window)
            out["steady"].update(memory(fleet, baseline, total))
            out["steady_load"] = load_now().__dict__
            show("steady state, heartbeats only", out["steady"], load_now())

            out["bc_nodes_json"] = await nodes_json(fleet)
            show(f"bc nodes --json at {total} nodes", out["bc_nodes_json"], load_now())

            out["storm"] = await storm(fleet, admin, total)
            show(f"reconnect storm, {args.nodes} sessions at once", out["storm"], load_now())

            if args.gateways > 1 and out["storm"]["all_back_s"] is not None:  # a re-home of a settled fleet
                listed = await store_connected(admin, total)
                await asyncio.sleep(args.settle)  # the storm's tail (liveness flushes) drained first
                out["rehome"] = await rehome_after_kill(admin, fleet.procs, listed)
                show(f"re-home after killing gw-1 of {args.gateways}", out["rehome"], load_now())
        return out
    finally:
        await fleet.stop()
        if args.keep:
            print(f"  kept {root}; schema {schema}", flush=True)
        else:
            await drop_schema(args.url, schema)
            shutil.rmtree(root, ignore_errors=True)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=1000, help="generated node sessions")
    ap.add_argument("--gateways", type=int, default=3, help="bc serve processes on one PostgreSQL schema")
    ap.add_argument("--agent-procs", type=int, default=2, help="generator processes the sessions are shared over")
    ap.add_argument("--control", type=int, default=3, help="full `bc node --fake-hw` processes among them")
    ap.add_argument("--settle", type=float, default=15.0, help="seconds of quiet before a measured window")
    ap.add_argument("--window", type=float, default=30.0, help="the steady-state window, seconds")
    ap.add_argument("--start-rate", type=float, default=0.0, help="sessions started a second (0: all at once)")
    ap.add_argument("--connect-timeout", type=float, default=600.0, help="seconds for the whole fleet to connect")
    ap.add_argument("--url", default=PG_URL)
    ap.add_argument("--keep", action="store_true", help="keep the data dirs, logs and schema")
    return ap


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    t0 = time.monotonic()
    result = asyncio.run(run(args))
    result["bench_s"] = round(time.monotonic() - t0)
    print(figure_line("fleet", json.dumps(result), load_now()), flush=True)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
