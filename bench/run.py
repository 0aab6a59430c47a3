"""`make bench`: figures for the foundation, printed, never asserted.

1. reserve → observed: the time from `Reserve` (Admin API) to the node's
   `node.observed` event for the new generation, over N reservations
   (median and p99), each released before the next. `bc serve` and `bc node`
   run as subprocesses, exactly as deployed; the bench is an Admin client
   watching the events log. Run twice: paced (250 ms between reservations,
   an operator's or a controller's rhythm) and back to back, where the
   gateway's status write budget (ten a second per node) shows.
2. gateway memory: `bc serve`'s resident set size with S agent sessions held
   open (the agents share one process here, as the issue allows).

Further parts live in their own modules: `commands`, `journal` (bench.commands), `dist`, `signing`,
`merkle`, `pair` (bench.session_pair), `jobs` (bench.jobs: the job queue's figures), `capacity`
(bench.capacity: the placement pass, reserve -> active, `bc usage`), `sim` (bench.sim: `bc sim` by fleet size),
`health` (bench.health: the telemetry export's CPU, injected XID -> `bc nodes show`),
`converge` (bench.converge: one converge pass with the host and devices sections non-empty),
`ssh` (bench.ssh: `bc ssh revoke` -> the serial in every node's KRL),
`secrets` (bench.secrets: a secret request's round trip, a rotation reaching every node),
`tunnel` (bench.tunnel: `bc port-forward` carrying 100 MiB each way, in MiB/s),
`release` (bench.release: a fake release rollout, the download vs curl),
`rehome` (bench.rehome: re-home after killing one of three gateways on PostgreSQL, 200 real agents),
`stores` (bench.stores: the store paths and commands end to end on SQLite and PostgreSQL; bench.pg_drivers
compares psycopg with asyncpg),
`throughput` (bench.throughput: inventory.refresh end to end at 1 / 10 / 100 nodes whose agents run in their
own process, enqueued with EnqueueCommands, with CPU per command and the bounds of the same run: the gRPC echo
rate and the store's fsynced commit rate; SQLite at each node count, PostgreSQL at 100),
`cli` (bench.cli_start: `bc nodes --json` against a running lab beside `python -c 'import grpc'`),
`nodes` (bench.nodes_list: `bc nodes --json` at 10,000 nodes seeded into the store, no fleet; SQLite, and
PostgreSQL when BC_TEST_POSTGRES is set).

Usage: python -m bench.run [--reservations 100] [--sessions 200]
       [--only latency|memory|commands|journal|hops|dist|signing|merkle|pair|jobs|capacity|sim|health|converge|ssh|
               tunnel|release|stores|rehome|throughput|cli|secrets|nodes]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

from agent.app import Agent, AgentOptions
from agent.join import join_node
from bc.client.admin import AdminClient
from bc.runtime.config import OperatorConfig
from bench.fleet_figures import status_rss_kib
from bench.stats import pct


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rss_kib(pid: int) -> int:
    return status_rss_kib(Path(f"/proc/{pid}/status").read_text())


class Lab:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.bc = str(Path(sys.executable).parent / "bc")
        self.env = dict(os.environ, HOME=str(root / "home"), BC_DATA_DIR=str(root / "server"))
        (root / "home").mkdir(parents=True, exist_ok=True)
        self.procs: list[subprocess.Popen[bytes]] = []

    def spawn(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        log = open(self.root / f"{name}.log", "ab")  # noqa: SIM115
        p = subprocess.Popen(
            [self.bc, *args], stdout=log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True
        )
        self.procs.append(p)
        return p

    async def serve(self) -> subprocess.Popen[bytes]:
        p = self.spawn("serve", "serve", "--data-dir", str(self.root / "server"), "--listen", self.address)
        cfg = self.root / "server" / "operator" / "config.json"
        for _ in range(300):
            if cfg.exists():
                break
            await asyncio.sleep(0.05)
        return p

    def admin(self) -> AdminClient:
        return AdminClient(OperatorConfig.load(self.root / "server" / "operator" / "config.json"), timeout_s=60)

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()


async def wait_observed(events: asyncio.Queue[tuple[str, int, float]], node_id: str, generation: int) -> float:
    while True:
        subject, g, at = await asyncio.wait_for(events.get(), 30)
        if subject == node_id and g >= generation:
            return at


async def bench_latency(n: int, pace_ms: int) -> dict[str, float]:
    root = Path(tempfile.mkdtemp(prefix="bc-bench-lat-"))
    lab = Lab(root)
    try:
        await lab.serve()
        async with lab.admin() as admin:
            tok = await admin.create_token("n1")
            await join_node(lab.address, tok.token, root / "n1")
            lab.spawn("n1", "node", "--data-dir", str(root / "n1"), "--fake-hw", "hgx-h100-8")
            events: asyncio.Queue[tuple[str, int, float]] = asyncio.Queue()

            async def follow() -> None:
                async for ev in admin.watch(type_prefix="node.observed"):
                    events.put_nowait(
                        (ev.subject, json.loads(ev.data_json)["observed_generation"], time.perf_counter())
                    )

            watcher = asyncio.create_task(follow())
            await wait_observed(events, "n1", 1)
            samples = []
            for _ in range(n):
                t0 = time.perf_counter()
                res = await admin.reserve(1, node_id="n1")
                at = await wait_observed(events, "n1", res.generation)
                samples.append((at - t0) * 1000)
                rel = await admin.release(res.id)
                await wait_observed(events, "n1", rel.generation)
                while True:  # the devices come back only once the node reports them released
                    if (await admin.list_reservations(node_id="n1")) == []:
                        break
                    await asyncio.sleep(0.01)
                await asyncio.sleep(pace_ms / 1000)
            watcher.cancel()
        samples.sort()
        return {
            "reservations": n,
            "pace_ms": pace_ms,
            "median_ms": round(statistics.median(samples), 1),
            "p99_ms": round(pct(samples, 0.99), 1),
            "min_ms": round(samples[0], 1),
            "max_ms": round(samples[-1], 1),
        }
    finally:
        lab.stop()
        shutil.rmtree(root, ignore_errors=True)


async def bench_memory(sessions: int) -> dict[str, float]:
    root = Path(tempfile.mkdtemp(prefix="bc-bench-mem-"))
    lab = Lab(root)
    agents: list[Agent] = []
    tasks: list[asyncio.Task[None]] = []
    try:
        serve = await lab.serve()
        idle_kib = rss_kib(serve.pid)
        async with lab.admin() as admin:
            sem = asyncio.Semaphore(16)

            async def join(i: int) -> None:
                async with sem:
                    tok = await admin.create_token(f"m{i:04d}")
                    await join_node(lab.address, tok.token, root / f"m{i:04d}")

            t0 = time.perf_counter()
            await asyncio.gather(*(join(i) for i in range(sessions)))
            join_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            for i in range(sessions):
                a = Agent(AgentOptions(data_dir=root / f"m{i:04d}", fake_hw="hgx-h100-8"))
                agents.append(a)
                tasks.append(asyncio.create_task(a.run()))
            while True:
                nodes = await admin.list_nodes()
                if sum(1 for n in nodes if n.state == "connected" and n.observed_generation >= 1) == sessions:
                    break
                await asyncio.sleep(0.5)
            connect_s = time.perf_counter() - t0
            await asyncio.sleep(5)  # let heartbeats and status flushes settle before reading RSS
            held_kib = rss_kib(serve.pid)
        return {
            "sessions": sessions,
            "serve_rss_idle_mib": round(idle_kib / 1024, 1),
            "serve_rss_with_sessions_mib": round(held_kib / 1024, 1),
            "per_session_kib": round((held_kib - idle_kib) / sessions, 1),
            "join_all_s": round(join_s, 1),
            "connect_and_converge_all_s": round(connect_s, 1),
        }
    finally:
        for a in agents:
            a.stopped.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        lab.stop()
        shutil.rmtree(root, ignore_errors=True)


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reservations", type=int, default=100)
    ap.add_argument("--sessions", type=int, default=200)
    ap.add_argument(
        "--only",
        choices=[
            "latency",
            "memory",
            "commands",
            "journal",
            "hops",
            "dist",
            "signing",
            "merkle",
            "pair",
            "jobs",
            "capacity",
            "sim",
            "tui",
            "health",
            "converge",
            "ssh",
            "secrets",
            "tunnel",
            "release",
            "stores",
            "rehome",
            "throughput",
            "cli",
            "nodes",
        ],
    )
    args = ap.parse_args()
    if args.only in (None, "latency"):
        for pace in (250, 0):
            figures = await bench_latency(args.reservations, pace)
            print("reserve -> observed_generation:", json.dumps(figures), flush=True)
    if args.only in (None, "memory"):
        print("gateway memory:", json.dumps(await bench_memory(args.sessions)), flush=True)
    if args.only in (None, "journal"):
        from bench.commands import journal_figures, journal_warnings

        journal = await journal_figures()
        print("journal writes:", json.dumps(journal), flush=True)
        for line in journal_warnings(journal):
            print(line, flush=True)
    if args.only in (None, "hops"):
        from bench.sqlite_hops import figures as hop_figures

        print("sqlite statement, microseconds:", json.dumps(await hop_figures(5000)), flush=True)
    if args.only in (None, "commands"):
        from bench.commands import commands_per_second

        for nodes in (1, 10, 100):
            print("inventory.refresh end to end:", json.dumps(await commands_per_second(nodes, 200)), flush=True)
    if args.only in (None, "throughput"):
        from bench.throughput import main as throughput_main

        await throughput_main(["--store", "both"])
    if args.only in (None, "cli"):
        from bench.cli_start import figures as cli_figures
        from bench.cli_start import report as cli_report

        cli_report(await cli_figures(21))
    if args.only in (None, "nodes"):
        from bench.nodes_list import figures as nodes_figures
        from bench.nodes_list import report as nodes_report

        nodes_report(await nodes_figures(10_000, 5, None, keep=False))
        if os.environ.get("BC_TEST_POSTGRES"):
            nodes_report(await nodes_figures(10_000, 5, os.environ["BC_TEST_POSTGRES"], keep=False))
    if args.only in (None, "dist"):
        from bench.dist import dist_figures

        print("dist:", json.dumps(await asyncio.to_thread(dist_figures)), flush=True)
    if args.only in (None, "signing"):
        from bench.signing import print_table, signing_figures

        print_table(await signing_figures())
    if args.only in (None, "merkle"):
        from bench.merkle import run as merkle_run

        merkle_run()
    if args.only in (None, "pair"):
        from bench.session_pair import main as pair_main

        await asyncio.to_thread(pair_main)
    if args.only in (None, "jobs"):
        from bench.jobs import parser as jobs_parser
        from bench.jobs import run as jobs_run

        await jobs_run(jobs_parser().parse_args([]))
    if args.only in (None, "capacity"):
        from bench.capacity import parser as capacity_parser
        from bench.capacity import run as capacity_run

        await capacity_run(capacity_parser().parse_args([]))
    if args.only in (None, "health"):
        from bench.health import parser as health_parser
        from bench.health import run as health_run

        await health_run(health_parser().parse_args([]))
    if args.only in (None, "tui"):
        await __import__("bench.tui", fromlist=["main"]).main([])
    if args.only in (None, "converge"):
        from bench.converge import main as converge_main
        from bench.converge import parser as converge_parser

        await converge_main(converge_parser().parse_args([]))
    if args.only in (None, "rehome"):
        from bench.pg_drivers import PG_URL
        from bench.rehome import run as rehome_run

        print(
            "re-home after a gateway kill:",
            json.dumps(await rehome_run(200, PG_URL)),
            flush=True,
        )
    if args.only in (None, "stores"):
        from bench.pg_drivers import PG_URL
        from bench.stores import run as stores_run

        print("stores:", json.dumps(await stores_run(200, PG_URL)), flush=True)
    if args.only in (None, "release"):
        from bench.release import parser as release_parser
        from bench.release import run as release_run

        await release_run(release_parser().parse_args([]))
    if args.only in (None, "sim"):
        from bench.sim import main as sim_main

        await asyncio.to_thread(sim_main, [])
    if args.only in (None, "secrets"):
        from bench.secrets import main as secrets_main

        await secrets_main([])
    if args.only in (None, "ssh"):
        from bench.ssh import main as ssh_main

        await ssh_main([])
    if args.only in (None, "tunnel"):
        from bench.tunnel import report
        from bench.tunnel import run as tunnel_run

        print(report(await tunnel_run(100)), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
