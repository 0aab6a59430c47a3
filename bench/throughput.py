"""Commands end to end, measured on the system and not on the client (issue 19, part 1; `make bench`).

    python -m bench.throughput [--nodes 1,10,100] [--commands 1000] [--chunk 500]
                               [--store sqlite|postgres|both] [--url postgresql://…] [--agent-procs 1]
                               [--gateways 1] [--json]

What runs, each in a process of its own:

* `bc serve` (a subprocess, as deployed) on its SQLite file, or with `--store postgres` on a fresh schema of
  the PostgreSQL database at `--url` (`bc serve --store postgresql://…?schema=bench_…`); with `--gateways G`
  the PostgreSQL runs have G `bc serve` processes on that schema (`--gateway-id gw-I`, each data dir a copy of
  gw-0's, as `bench.rehome` starts a fleet's), node I joined with every address and gw-(I mod G) first, and
  the serve figures are the sum over the G processes (SQLite has one writer: its runs keep one gateway);
* the agents: `python -m bench.agents_proc` hosting N production agents (`bc node --fake-hw hgx-h100-8`'s
  parts: each its own fsynced SQLite journal, real gRPC with mutual TLS) on one event loop, or split over
  `--agent-procs` processes; they count the session's frames by type (`bench.agents_proc.CountingLink`);
* this process, an Admin client like any other: it enqueues K `inventory.refresh` commands round-robin
  over the nodes with `EnqueueCommands` in chunks of `--chunk`, one call after another, and follows
  `Watch(type_prefix="command.settled")` until all K have settled.

It reports, per store and node count:

* throughput: K ÷ the wall time from the first `EnqueueCommands` call to the last settlement seen;
* latency per command, median and p99: the `command.settled` event's time minus the `command.enqueued`
  event's (both stamped by the store's clock in the transactions that made them);
* CPU seconds per command in `bc serve` and in the agents' process(es) (utime + stime from
  /proc/PID/stat over the window), gross and net of the idle rate measured just before (heartbeats,
  health passes);
* messages per command on the wire, counted at the agents' links, both directions, by type;

and beside them, measured in the same run, the bounds: the gRPC echo rate on one stream (`bench.echo`:
messages/s, both directions counted, mutual TLS, server and client in separate processes) and the raw
fsynced commit rate of the store (SQLite: a file in the same directory, one INSERT + COMMIT per
transaction, WAL, synchronous=FULL; PostgreSQL: a single-row INSERT + COMMIT per transaction on the same
database). A warning line is printed for each ratio below its goal (issue 19): ≥ 1,000 commands/s at 100
nodes on SQLite, ≥ 0.5 of the echo rate ÷ messages per command, PostgreSQL (with its `--gateways`) ≥ 0.8 of
SQLite's one gateway at the same node count (issue 38).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import secrets
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

from agent.join import join_node
from bc.client.admin import AdminClient
from bc.protocol.pb import admin_pb2
from bc.runtime.config import OperatorConfig
from bench.echo import echo_rate
from bench.fleet_figures import stat_cpu_s
from bench.pg_drivers import PG_URL
from bench.run import free_port
from bench.stats import pct

ROOT = Path(__file__).resolve().parent.parent
TICKS = os.sysconf("SC_CLK_TCK")
KIND = "inventory.refresh"

GOAL_SQLITE_100 = 1000.0
GOAL_OF_ECHO_BOUND = 0.5
GOAL_PG_OF_SQLITE = 0.8


def cpu_s(pid: int) -> float:
    """utime + stime of a process, in seconds (/proc/PID/stat fields 14 and 15)."""
    return stat_cpu_s(Path(f"/proc/{pid}/stat").read_text(), TICKS)


def self_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


# -- the bounds ------------------------------------------------------------------------------------


def sqlite_commit_rate(path: Path, seconds: float = 2.0) -> float:
    """One INSERT + COMMIT per transaction on a WAL file with synchronous=FULL, as fast as it goes."""
    conn = sqlite3.connect(str(path), isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v BLOB)")
        payload = b"x" * 200
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT INTO t (v) VALUES (?)", (payload,))
            conn.execute("COMMIT")
            n += 1
        return n / (time.perf_counter() - t0)
    finally:
        conn.close()
        for suffix in ("", "-wal", "-shm"):
            Path(str(path) + suffix).unlink(missing_ok=True)


def postgres_commit_rate(url: str, seconds: float = 2.0) -> float:
    """One single-row INSERT + COMMIT per transaction, on a scratch schema of the database at `url`."""
    import psycopg
    from psycopg import sql

    schema = "bench_commit_" + secrets.token_hex(4)
    with psycopg.connect(url) as conn:
        try:
            conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
            table = sql.Identifier(schema, "t")
            conn.execute(sql.SQL("CREATE TABLE {} (id BIGSERIAL PRIMARY KEY, v BYTEA)").format(table))
            conn.commit()
            insert = sql.SQL("INSERT INTO {} (v) VALUES (%s)").format(table)
            payload = b"x" * 200
            n, t0 = 0, time.perf_counter()
            while time.perf_counter() - t0 < seconds:
                conn.execute(insert, (payload,))
                conn.commit()
                n += 1
            return n / (time.perf_counter() - t0)
        finally:
            conn.rollback()
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
            conn.commit()


# -- the system ------------------------------------------------------------------------------------


@dataclass
class Lab:
    root: Path
    store_url: str = ""  # "" for the SQLite file in the data dir
    gateways: int = 1
    ports: list[int] = field(default_factory=list)
    serves: list[subprocess.Popen[bytes]] = field(default_factory=list)
    agents: list[subprocess.Popen[str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.ports = self.ports or [free_port() for _ in range(self.gateways)]

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.ports[0]}"

    def join_order(self, i: int) -> str:
        """Node i's gateway addresses, gw-(i mod G) first: the fleet's sessions spread over the gateways."""
        addrs = [f"127.0.0.1:{p}" for p in self.ports]
        return ",".join(addrs[(i + k) % len(addrs)] for k in range(len(addrs)))

    @property
    def env(self) -> dict[str, str]:
        return dict(
            os.environ,
            HOME=str(self.root / "home"),
            BC_DATA_DIR=str(self.root / "server"),
            PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")])),
        )

    def spawn_serve(self, i: int = 0) -> subprocess.Popen[bytes]:
        (self.root / "home").mkdir(parents=True, exist_ok=True)
        data = self.root / ("server" if i == 0 else f"server-{i}")
        args = ["serve", "--data-dir", str(data), "--listen", f"127.0.0.1:{self.ports[i]}"]
        if self.store_url:
            args += ["--store", self.store_url]
        if self.gateways > 1:
            args += ["--gateway-id", f"gw-{i}"]
        bc = str(Path(sys.executable).parent / "bc")
        with open(self.root / ("serve.log" if i == 0 else f"serve-{i}.log"), "ab") as log:
            return subprocess.Popen(
                [bc, *args], stdout=log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True, cwd=ROOT
            )

    def spawn_agents(self, group: list[Path], i: int) -> subprocess.Popen[str]:
        with open(self.root / f"agents-{i}.log", "ab") as log:
            return subprocess.Popen(
                [sys.executable, "-m", "bench.agents_proc", *map(str, group)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                env=self.env,
                cwd=ROOT,
                start_new_session=True,
            )

    async def start_serve(self) -> None:
        """gw-0, then the others one after another, each a copy of gw-0's data dir (its CA and keys)."""
        for i in range(self.gateways):
            if i > 0:
                shutil.copytree(self.root / "server", self.root / f"server-{i}")
            serve = self.spawn_serve(i)
            self.serves.append(serve)
            deadline = time.monotonic() + 60
            while True:
                if serve.poll() is not None:
                    raise RuntimeError(f"bc serve exited {serve.returncode}; see {self.root}/serve*.log")
                if (self.root / "server" / "operator" / "config.json").exists():
                    try:
                        _, w = await asyncio.open_connection("127.0.0.1", self.ports[i])
                        w.close()
                        break
                    except OSError:
                        pass
                if time.monotonic() > deadline:
                    raise RuntimeError("bc serve did not start in 60 s")
                await asyncio.sleep(0.05)

    def admin(self) -> AdminClient:
        return AdminClient(OperatorConfig.load(self.root / "server" / "operator" / "config.json"), timeout_s=120)

    async def start_agents(self, dirs: list[Path], procs: int) -> None:
        groups = [dirs[i::procs] for i in range(procs) if dirs[i::procs]]
        self.agents += [self.spawn_agents(group, i) for i, group in enumerate(groups)]
        for p, group in zip(self.agents, groups, strict=True):
            assert p.stdout is not None
            line = await asyncio.to_thread(p.stdout.readline)
            if line.strip() != f"ready {len(group)}":
                raise RuntimeError(f"the agents process said {line!r}; see {self.root}/agents-*.log")

    async def agent_stats(self) -> dict[str, Any]:
        total: dict[str, Any] = {"sent": Counter(), "received": Counter(), "sent_bytes": 0, "received_bytes": 0}
        for p in self.agents:
            assert p.stdin is not None and p.stdout is not None
            p.stdin.write("stats\n")
            p.stdin.flush()
            doc = json.loads(await asyncio.to_thread(p.stdout.readline))
            total["sent"].update(doc["sent"])
            total["received"].update(doc["received"])
            total["sent_bytes"] += doc["sent_bytes"]
            total["received_bytes"] += doc["received_bytes"]
        return total

    def cpu(self) -> tuple[float, float]:
        return sum(cpu_s(p.pid) for p in self.serves), sum(cpu_s(p.pid) for p in self.agents)

    def stop(self) -> None:
        for p in self.agents:
            if p.poll() is None and p.stdin is not None:
                try:
                    p.stdin.write("stop\n")
                    p.stdin.flush()
                except BrokenPipeError:
                    pass
        for p in self.agents:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
        for serve in self.serves:
            if serve.poll() is None:
                serve.send_signal(signal.SIGTERM)
        for serve in self.serves:
            try:
                serve.wait(timeout=15)
            except subprocess.TimeoutExpired:
                serve.kill()


async def wait_connected(admin: AdminClient, n: int, timeout_s: float = 120) -> None:
    async with asyncio.timeout(timeout_s):
        while True:  # polling the Admin API, as any client would
            if sum(1 for x in await admin.list_nodes() if x.state == "connected") >= n:
                return
            await asyncio.sleep(0.2)


async def enqueue_and_settle(
    admin: AdminClient, node_ids: list[str], k: int, chunk: int
) -> tuple[float, float, dict[str, tuple[str, int]]]:
    """Enqueue k commands round-robin in chunks, follow their settlement; (wall seconds, enqueue seconds,
    {id: (state, settled at_ms)})."""
    after = (await admin.server_info()).event_seq
    settled: dict[str, tuple[str, int]] = {}
    ids: set[str] = set()
    enqueued = asyncio.Event()
    done = asyncio.Event()

    async def follow() -> None:
        async for ev in admin.watch(after_seq=after, type_prefix="command.settled"):
            settled[ev.subject] = (json.loads(ev.data_json).get("state", ""), ev.at_ms)
            if enqueued.is_set() and ids <= settled.keys():
                done.set()
                return

    watcher = asyncio.create_task(follow())
    t0 = time.perf_counter()
    for start in range(0, k, chunk):
        reqs = [
            admin_pb2.RunCommandRequest(node_id=node_ids[i % len(node_ids)], kind=KIND)
            for i in range(start, min(k, start + chunk))
        ]
        ids.update(c.id for c in await admin.enqueue_commands(reqs))
    t_enq = time.perf_counter() - t0
    enqueued.set()
    if ids <= settled.keys():
        done.set()
    async with asyncio.timeout(600):
        await done.wait()
    elapsed = time.perf_counter() - t0
    watcher.cancel()
    return elapsed, t_enq, {i: settled[i] for i in ids}


async def enqueued_at(admin: AdminClient, after: int, ids: set[str]) -> dict[str, int]:
    """Each command's `command.enqueued` time (the store's clock), read from the events log after the run."""
    out: dict[str, int] = {}
    while len(out) < len(ids):
        page = await admin.list_events(after_seq=after, limit=10_000, type_prefix="command.enqueued")
        if not page:
            break
        for ev in page:
            if ev.subject in ids:
                out[ev.subject] = ev.at_ms
        after = page[-1].seq
    return out


async def run_once(
    store: str, nodes: int, k: int, chunk: int, url: str, agent_procs: int, keep: bool = False, gateways: int = 1
) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix=f"bc-bench-tput-{store}-{nodes}-"))
    schema = "bench_" + secrets.token_hex(4)
    if store == "postgres":
        lab = Lab(root, f"{url}{'&' if '?' in url else '?'}schema={schema}", gateways=gateways)
    else:
        lab = Lab(root)
    try:
        await lab.start_serve()
        async with lab.admin() as admin:
            gate = asyncio.Semaphore(16)
            node_ids = [f"t{i:05d}" for i in range(nodes)]

            async def join(i: int, node_id: str) -> None:
                async with gate:
                    tok = await admin.create_token(node_id)
                    await join_node(lab.join_order(i), tok.token, root / node_id)

            await asyncio.gather(*(join(i, n) for i, n in enumerate(node_ids)))
            await lab.start_agents([root / n for n in node_ids], agent_procs)
            await wait_connected(admin, nodes)
            # Warm-up, not measured: one command per node (first dispatch, first journal writes, caches).
            await enqueue_and_settle(admin, node_ids, nodes, chunk)
            # The idle rate just before: heartbeats, health passes, liveness.
            serve0, agents0 = lab.cpu()
            await asyncio.sleep(2.0)
            serve1, agents1 = lab.cpu()
            idle = (serve1 - serve0) / 2.0, (agents1 - agents0) / 2.0

            before = await lab.agent_stats()
            after_seq = (await admin.server_info()).event_seq
            serve0, agents0 = lab.cpu()
            client0 = self_cpu_s()
            elapsed, t_enq, outcome = await enqueue_and_settle(admin, node_ids, k, chunk)
            serve1, agents1 = lab.cpu()
            client1 = self_cpu_s()
            stats = await lab.agent_stats()
            enq = await enqueued_at(admin, after_seq, set(outcome))
        latencies = [at - enq[i] for i, (_, at) in outcome.items() if i in enq]
        states = Counter(s for s, _ in outcome.values())
        sent = stats["sent"] - before["sent"]
        received = stats["received"] - before["received"]
        messages = sum(sent.values()) + sum(received.values())
        serve_cpu, agents_cpu = serve1 - serve0, agents1 - agents0
        return {
            "store": store,
            "gateways": lab.gateways,
            "nodes": nodes,
            "commands": k,
            "chunk": chunk,
            "agent_procs": len(lab.agents),
            "seconds": round(elapsed, 2),
            "enqueue_seconds": round(t_enq, 2),
            "commands_per_s": round(k / elapsed, 1),
            "states": dict(states),
            "latency_ms": {
                "median": round(statistics.median(latencies), 1),
                "p99": round(pct(latencies, 0.99), 1),
                "max": max(latencies),
            },
            "cpu_ms_per_command": {
                "serve": round(serve_cpu / k * 1000, 2),
                "serve_net_of_idle": round((serve_cpu - idle[0] * elapsed) / k * 1000, 2),
                "agents": round(agents_cpu / k * 1000, 2),
                "agents_net_of_idle": round((agents_cpu - idle[1] * elapsed) / k * 1000, 2),
                "client": round((client1 - client0) / k * 1000, 2),
            },
            "cores_busy": {
                "serve": round(serve_cpu / elapsed, 2),
                "agents": round(agents_cpu / elapsed, 2),
                "serve_idle": round(idle[0], 3),
                "agents_idle": round(idle[1], 3),
            },
            "messages_per_command": round(messages / k, 2),
            "messages_by_type": {
                **{f"up.{t}": round(n / k, 3) for t, n in sorted(sent.items())},
                **{f"down.{t}": round(n / k, 3) for t, n in sorted(received.items())},
            },
            "bytes_per_command": round(
                (stats["sent_bytes"] - before["sent_bytes"] + stats["received_bytes"] - before["received_bytes"]) / k
            ),
        }
    finally:
        lab.stop()
        if store == "postgres":
            from bc.store.postgres import drop_schema

            await drop_schema(url, schema)
        if not keep:
            shutil.rmtree(root, ignore_errors=True)


# -- the report ------------------------------------------------------------------------------------


def judge(results: list[dict[str, Any]], bounds: dict[str, Any]) -> list[str]:
    """The warning lines: each ratio below its goal."""
    echo = bounds["echo"]["messages_per_s"]
    out = []
    by = {(r["store"], r["nodes"]): r for r in results}
    for r in results:
        bound = echo / r["messages_per_command"]
        r["echo_bound_commands_per_s"] = round(bound, 1)
        r["of_echo_bound"] = round(r["commands_per_s"] / bound, 3)
        if r["of_echo_bound"] < GOAL_OF_ECHO_BOUND:
            out.append(
                f"WARNING: {r['store']} at {r['nodes']} nodes: {r['commands_per_s']:,.0f} commands/s is"
                f" {r['of_echo_bound']:.2f} of the echo bound ({echo:,} msg/s ÷ {r['messages_per_command']} msg"
                f" per command = {bound:,.0f}/s); goal ≥ {GOAL_OF_ECHO_BOUND}"
            )
        if sum(r["states"].values()) != r["states"].get("succeeded", 0):
            out.append(f"WARNING: {r['store']} at {r['nodes']} nodes: not every command succeeded: {r['states']}")
        if r["store"] == "sqlite" and r["nodes"] == 100 and r["commands_per_s"] < GOAL_SQLITE_100:
            out.append(
                f"WARNING: sqlite at 100 nodes: {r['commands_per_s']:,.0f} commands/s; goal ≥ {GOAL_SQLITE_100:,.0f}"
            )
        if r["store"] == "postgres" and ("sqlite", r["nodes"]) in by:
            ratio = r["commands_per_s"] / by[("sqlite", r["nodes"])]["commands_per_s"]
            r["of_sqlite"] = round(ratio, 2)
            if ratio < GOAL_PG_OF_SQLITE:
                out.append(
                    f"WARNING: postgres ({r['gateways']} gateways) at {r['nodes']} nodes: {ratio:.2f} of the"
                    " sqlite figure (one gateway);"
                    f" goal ≥ {GOAL_PG_OF_SQLITE}"
                )
    return out


def table(results: list[dict[str, Any]], bounds: dict[str, Any]) -> str:
    head = (
        "STORE",
        "GW",
        "NODES",
        "CMDS",
        "CMD/S",
        "P50 MS",
        "P99 MS",
        "SERVE MS/CMD",
        "AGENTS MS/CMD",
        "MSG/CMD",
        "ECHO BOUND/S",
        "OF BOUND",
    )
    rows = [
        (
            r["store"],
            str(r["gateways"]),
            str(r["nodes"]),
            str(r["commands"]),
            f"{r['commands_per_s']:,.1f}",
            f"{r['latency_ms']['median']:,.0f}",
            f"{r['latency_ms']['p99']:,.0f}",
            f"{r['cpu_ms_per_command']['serve']:.2f} ({r['cpu_ms_per_command']['serve_net_of_idle']:.2f})",
            f"{r['cpu_ms_per_command']['agents']:.2f} ({r['cpu_ms_per_command']['agents_net_of_idle']:.2f})",
            f"{r['messages_per_command']:.2f}",
            f"{r['echo_bound_commands_per_s']:,.0f}",
            f"{r['of_echo_bound']:.2f}",
        )
        for r in results
    ]
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(head)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(head, widths, strict=True)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    echo = bounds["echo"]
    lines.append("")
    lines.append(
        f"bounds, same run: gRPC echo on one stream {echo['messages_per_s']:,} messages/s"
        f" ({echo['message_bytes']} B, mTLS, both directions counted);"
        + "".join(f" {s} fsynced commits {v:,.0f}/s;" for s, v in bounds["commits_per_s"].items())
    )
    lines.append("MS/CMD: CPU milliseconds per command, gross (net of the idle rate measured just before).")
    for r in results:
        kinds = ", ".join(f"{t} {n}" for t, n in r["messages_by_type"].items())
        lines.append(
            f"{r['store']} {r['nodes']} nodes: messages per command: {kinds}; {r['bytes_per_command']} B;"
            f" cores busy serve {r['cores_busy']['serve']}, agents {r['cores_busy']['agents']};"
            f" client {r['cpu_ms_per_command']['client']} ms/cmd; states {r['states']}"
        )
    return "\n".join(lines)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    stores = ["sqlite", "postgres"] if args.store == "both" else [args.store]
    nodes = [int(n) for n in args.nodes.split(",")]
    work = Path(tempfile.mkdtemp(prefix="bc-bench-bounds-"))
    try:
        bounds: dict[str, Any] = {"echo": await echo_rate(work), "commits_per_s": {}}
        if "sqlite" in stores:
            bounds["commits_per_s"]["sqlite"] = round(sqlite_commit_rate(work / "raw.db"))
        if "postgres" in stores:
            bounds["commits_per_s"]["postgres"] = round(postgres_commit_rate(args.url))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    # With both stores, PostgreSQL runs at the largest node count only: where its goal (0.7 of SQLite) is set,
    # and it keeps `make bench` within minutes on a store that is slower per command today.
    plan = [(s, n) for s in stores for n in nodes if s == "sqlite" or len(stores) == 1 or n == max(nodes)]
    results = []
    for store, n in plan:
        gateways = args.gateways if store == "postgres" else 1
        r = await run_once(store, n, args.commands, args.chunk, args.url, args.agent_procs, args.keep, gateways)
        if not args.json:
            print(
                f"  {store} {n} nodes: {r['commands_per_s']:,.1f} commands/s, p50 {r['latency_ms']['median']:,.0f} ms",
                file=sys.stderr,
                flush=True,
            )
        results.append(r)
    warnings = judge(results, bounds)
    return {"bounds": bounds, "results": results, "warnings": warnings}


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", default="1,10,100", help="node counts, comma-separated (default 1,10,100)")
    ap.add_argument("--commands", type=int, default=1000, help="commands per node count (default 1000)")
    ap.add_argument("--chunk", type=int, default=500, help="commands per EnqueueCommands call (default 500)")
    ap.add_argument(
        "--store",
        choices=["sqlite", "postgres", "both"],
        default="sqlite",
        help="both: SQLite at every node count, PostgreSQL at the largest",
    )
    ap.add_argument("--url", default=PG_URL, help="the PostgreSQL database (a fresh schema per run)")
    ap.add_argument("--agent-procs", type=int, default=1, help="processes the agents are spread over (default 1)")
    ap.add_argument(
        "--gateways", type=int, default=1, help="bc serve processes on the PostgreSQL runs' store (default 1)"
    )
    ap.add_argument("--keep", action="store_true", help="keep the run's directories (logs) for a look")
    ap.add_argument("--json", action="store_true")
    return ap


async def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    out = await run(args)
    if args.json:
        print(json.dumps(out, indent=2))
        return
    print(table(out["results"], out["bounds"]))
    for w in out["warnings"]:
        print(w)


if __name__ == "__main__":
    asyncio.run(main())
