"""Re-home after killing one of three gateways (`make bench --only rehome`; issue 16's figure).

Three `bc serve` processes (`--gateway-id gw-0..2`) share one PostgreSQL schema; N agents run in
this process over real gRPC and mutual TLS, each joined with all three addresses and its own first
choice (node i starts at gw-(i mod 3)), so the fleet is spread. Once every node is connected, gw-1 is
killed with SIGKILL; for each node it held, the time from the kill to the node's `node.connectivity
connected` event on another gateway (read from the events log, stamped by the store's clock) gives
the p50 / p99 / max.

The agents are production agents with their own fsynced journals (the default, as `bc node` runs),
or with `--light` the simulator's agents (`bench.light_agents`: memory journal, work inline), which
is how 1,000 and 10,000 sessions fit in one process.

Two more figures come from the same fleet, before the kill (issue 19):

* `--status-every S`: each node re-sends its status every S seconds for four stats periods; the status
  writes per second the gateways logged, and the CPU each gateway process used meanwhile (percent of one
  core, from /proc);
* `--refresh`: one `inventory.refresh` to every node, enqueued with `EnqueueCommands`, and the wall time
  until every one has settled (with the p50 / p99 of each command's enqueue -> settled).

`--keep` keeps the joined fleet (data dirs, logs, schema) and `--reuse DIR` runs again on it without joining
(10,000 joins take about six minutes).
`--start-rate R` starts the agents R a second (a rolling start, as a fleet powered on by racks) instead
of all at once; the re-home after the kill is still the storm it measures. `--settle S` waits S once the
fleet is connected, then measures S of each process's idle CPU, before anything else.
`--gateways N` (default 3) runs N gateway processes; `--no-kill` skips the kill (with one gateway there is
none to move to); `--agent-procs K` runs the `--light` agents in K processes of their own
(`bench.light_agents_proc`), since one process's core bounds a re-home of 1,000 agents held in it.

Usage: python -m bench.rehome [--nodes 200] [--light [--agent-procs K]] [--gateways 3] [--status-every S]
                              [--refresh] [--no-kill] [--keep | --reuse DIR] [--url postgresql://postgres@127.0.0.1/test]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import re
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from agent.app import Agent, AgentOptions
from agent.join import join_node
from bc.client.admin import AdminClient
from bc.errors import Unavailable
from bc.gateway.counters import STATS_EVERY_S
from bc.runtime.config import OperatorConfig
from bc.store.postgres import drop_schema
from bench.light_agents import light_agent, offer_status
from bench.light_agents_proc import start_agents
from bench.pg_drivers import PG_URL
from bench.run import Lab, free_port
from bench.stats import pct
from bench.throughput import cpu_s, enqueue_and_settle

GATEWAYS = 3
FLEET_FILE = "fleet.json"
"""What `--reuse` needs of a kept fleet: its schema, the gateways' ports the nodes joined with, its size."""


async def _listening(port: int, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            _, w = await asyncio.open_connection("127.0.0.1", port)
            w.close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.05)


_STATS = re.compile(r"^ts=(\S+ \S+) .*event=gateway\.stats .*status_written=(\d+)")


def status_written(log: Path) -> list[tuple[float, int]]:
    """(time, cumulative status writes) from a gateway's `event=gateway.stats` lines."""
    out = []
    for line in log.read_text(errors="replace").splitlines():
        m = _STATS.match(line)
        if m:
            at = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").replace(tzinfo=UTC).timestamp()
            out.append((at, int(m.group(2))))
    return out


def write_rate(points: list[tuple[float, int]], start: float, end: float) -> float:
    """Writes per second between the first stats line after `start` and the last one before `end`."""
    inside = [(t, c) for t, c in points if start <= t <= end]
    if len(inside) < 2:
        return 0.0
    (t0, c0), (t1, c1) = inside[0], inside[-1]
    return (c1 - c0) / (t1 - t0) if t1 > t0 else 0.0


JOIN_PROGRESS_S = 10.0
SETTLE_S = 10.0


def join_rate_figures(joined_at: list[float], start: float) -> dict[str, float]:
    """Joins per second overall, over the first and the last thousand: a rate that falls as tokens pile up shows."""
    times = sorted(joined_at)
    if not times:
        return {}
    out = {"joins_per_s": round(len(times) / max(times[-1] - start, 1e-9), 1)}
    if len(times) > 2000:
        out["joins_per_s_first_1000"] = round(1000 / max(times[999] - start, 1e-9), 1)
        out["joins_per_s_last_1000"] = round(1000 / max(times[-1] - times[-1001], 1e-9), 1)
    return out


def exited(procs: dict[str, Any]) -> dict[str, int]:
    """The gateway processes that are no longer running, with their exit status (-8 is SIGFPE)."""
    return {
        name: p.returncode
        for name, p in procs.items()
        if name.startswith("gw-") and isinstance(p, subprocess.Popen) and p.poll() is not None
    }


async def run(
    nodes: int | None,
    url: str,
    keep: bool = False,
    light: bool = False,
    status_every_s: float = 0.0,
    gateways: int = GATEWAYS,
    refresh: bool = False,
    kill: bool = True,
    agent_procs: int = 1,
    reuse: Path | None = None,
    settle_s: float = SETTLE_S,
    start_rate: float = 0.0,
) -> dict[str, Any]:
    if agent_procs > 1 and not light:
        raise SystemExit("--agent-procs takes --light agents")
    if reuse is not None:  # a fleet joined by an earlier `--keep` run: its schema, data dirs and ports
        root = reuse
        meta = json.loads((root / FLEET_FILE).read_text())
        schema, ports, gateways = meta["schema"], meta["ports"], meta["gateways"]
        nodes = meta["nodes"] if nodes is None else min(nodes, meta["nodes"])  # the first N of the fleet
        keep = True
        lab = Lab(root)
    else:
        nodes = nodes or 200
        root = Path(tempfile.mkdtemp(prefix="bc-bench-rehome-"))
        schema = "bench_" + secrets.token_hex(4)
        lab = Lab(root)
        ports = [lab.port, *(free_port() for _ in range(gateways - 1))]
        meta = {"schema": schema, "ports": ports, "nodes": nodes, "gateways": gateways}
        (root / FLEET_FILE).write_text(json.dumps(meta))
    print(f"  data dirs and logs in {root}", flush=True)
    store = f"{url}?schema={schema}"
    addrs = [f"127.0.0.1:{p}" for p in ports]
    procs: dict[str, Any] = {}
    agents: list[Agent] = []
    tasks: list[asyncio.Task[None]] = []
    try:
        procs.update(await start_gateways(lab, root, store, addrs, copy=reuse is None))
        cfg = root / "server" / "operator" / "config.json"
        async with AdminClient(OperatorConfig.load(cfg), timeout_s=60) as admin:
            if reuse is None:
                joined_s, join_rates = await join_fleet(admin, root, addrs, range(nodes))
            else:
                joined_s, join_rates = 0.0, {}
            t_connect = time.monotonic()
            if agent_procs > 1:  # light agents shared out over processes of their own (bench.light_agents_proc)
                procs.update(await spawn_agent_procs(root, nodes, agent_procs, start_rate))
                await agent_procs_ready(procs)
                print(f"  {nodes}/{nodes} connected after {time.monotonic() - t_connect:.0f} s", flush=True)
            else:
                for i in range(nodes):
                    d = root / f"r{i:05d}"
                    agents.append(light_agent(d, i) if light else Agent(AgentOptions(data_dir=d, fake_hw="hgx-h100-8")))
                tasks.append(asyncio.create_task(start_agents(agents, tasks, start_rate)))
                while True:
                    up = sum(1 for a in agents if a.connected.is_set())
                    print(f"  {up}/{nodes} connected after {time.monotonic() - t_connect:.0f} s", flush=True)
                    if up >= nodes:
                        break
                    await asyncio.sleep(2.0)
            listed = await store_connected(admin, nodes)
            connected_s = time.monotonic() - t_connect
            print(f"  all {nodes} connected in the store after {connected_s:.0f} s", flush=True)
            idle = await idle_cpu(procs, settle_s)
            if idle:
                print(f"  {idle}", flush=True)
            status: dict[str, Any] = {}
            if status_every_s > 0:
                window = STATS_EVERY_S * 4 + 1
                print(f"  offering each node's status every {status_every_s} s for {window:.0f} s", flush=True)
                t0 = time.time()
                cpu0 = [cpu_s(procs[f"gw-{g}"].pid) for g in range(gateways)]
                if agents:
                    offered = await offer_status(agents, status_every_s, window)
                else:  # the agents' own processes offer it (bench.light_agents_proc)
                    offered = await offer_status_in_procs(procs, status_every_s, window)
                t1 = time.time()
                cpu1 = [cpu_s(procs[f"gw-{g}"].pid) for g in range(gateways)]
                await asyncio.sleep(STATS_EVERY_S + 1)  # the gateways' next stats lines close the window
                rates = [
                    write_rate(status_written(root / f"gw-{g}.log"), t0, t1 + STATS_EVERY_S + 1)
                    for g in range(gateways)
                ]
                status = {
                    "status_offered_per_s": round(offered / (t1 - t0)),
                    "status_written_per_s": round(sum(rates)),
                    "status_written_per_gateway": [round(r) for r in rates],
                    "gateway_cpu_pct_of_a_core": [
                        round(100 * (b - a) / (t1 - t0)) for a, b in zip(cpu0, cpu1, strict=True)
                    ],
                }
                print(f"  {status}", flush=True)
            fleet_refresh: dict[str, Any] = {}
            if refresh:
                ids = sorted(n.node_id for n in listed)
                print(f"  one inventory.refresh to each of {len(ids)} nodes", flush=True)
                wall, t_enq, settled = await enqueue_and_settle(admin, ids, len(ids), min(len(ids), 5000))
                # Per command: enqueue -> settled, from the enqueue call's start (the store stamps the settle).
                started_ms = time.time() * 1000 - wall * 1000
                lat = [max(0.0, (at - started_ms) / 1000) for _, at in settled.values()]
                fleet_refresh = {
                    "refresh_nodes": len(ids),
                    "refresh_wall_s": round(wall, 2),
                    "refresh_enqueue_s": round(t_enq, 2),
                    "refresh_settled_p50_s": round(statistics.median(lat), 2),
                    "refresh_settled_p99_s": round(pct(lat, 0.99), 2),
                    "refresh_succeeded": sum(1 for st, _ in settled.values() if st == "succeeded"),
                }
                print(f"  {fleet_refresh}", flush=True)
            if not kill or gateways < 2:
                return {
                    "nodes": nodes,
                    "agents": "light" if light else "production",
                    "gateways": gateways,
                    **idle,
                    **status,
                    **fleet_refresh,
                    "joined_s": round(joined_s, 1),
                    **join_rates,
                    "all_connected_s": round(connected_s, 1),
                    "gateways_exited": exited(procs),
                }
            rehomed = await rehome_after_kill(admin, procs, listed)
        return {
            "nodes": nodes,
            "agents": "light" if light else "production",
            "gateways": gateways,
            **idle,
            **status,
            **fleet_refresh,
            "joined_s": round(joined_s, 1),
            **join_rates,
            "all_connected_s": round(connected_s, 1),
            "gateways_exited": {k: v for k, v in exited(procs).items() if k != "gw-1"},
            **rehomed,
        }
    finally:
        for a in agents:
            a.stopped.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        for name, p in procs.items():
            if name.startswith("agents-") and isinstance(p, asyncio.subprocess.Process):
                if p.stdin is not None and p.returncode is None:
                    try:
                        p.stdin.write(b"stop\n")
                        await p.stdin.drain()
                    except ConnectionError:  # it ended already (killed): the gateways must still be stopped
                        pass
                await p.wait()
        lab.stop()
        if keep:
            print(f"  kept: rerun with --reuse {root}; schema {schema}", flush=True)
        else:
            await drop_schema(url, schema)
            shutil.rmtree(root, ignore_errors=True)


async def start_gateways(
    lab: Lab, root: Path, store: str, addrs: list[str], copy: bool = True
) -> dict[str, subprocess.Popen[bytes]]:
    """`bc serve` gw-0 … gw-(G-1) on one store, one after another (each opens the store and takes its lease
    in turn); the others' data dirs are copies of gw-0's (`copy`: not when a kept fleet's are there)."""
    procs: dict[str, subprocess.Popen[bytes]] = {}
    first = root / "server"
    for i, addr in enumerate(addrs):
        d = first if i == 0 else root / f"server-{i}"
        if i > 0 and copy:
            shutil.copytree(first, d)
        name = f"gw-{i}"
        procs[name] = lab.spawn(
            name, "serve", "--store", store, "--gateway-id", name, "--data-dir", str(d), "--listen", addr
        )
        await _listening(int(addr.rsplit(":", 1)[1]))
    return procs


async def join_fleet(
    admin: AdminClient, root: Path, addrs: list[str], indices: range
) -> tuple[float, dict[str, float]]:
    """Join nodes `r{i:05d}` (data dirs under `root`), 32 at a time, each with all the gateways' addresses and
    its own first choice (node i starts at gw-(i mod G)); the seconds it took and `join_rate_figures`."""
    gateways = len(addrs)
    sem = asyncio.Semaphore(32)
    t_join = time.monotonic()
    joined_at: list[float] = []  # when each join returned: the rate as the tokens pile up

    async def join(i: int) -> None:
        order = ",".join(addrs[(i + k) % gateways] for k in range(gateways))
        async with sem:
            tok = await admin.create_token(f"r{i:05d}")
            for wait in (0.5, 1.0, 2.0, 5.0):  # a busy gateway; a refused token is final
                try:
                    await join_node(order, tok.token, root / f"r{i:05d}")
                    joined_at.append(time.monotonic())
                    return
                except Unavailable:
                    await asyncio.sleep(wait)
            await join_node(order, tok.token, root / f"r{i:05d}")
            joined_at.append(time.monotonic())

    async def join_progress() -> None:
        done, since = 0, t_join
        while True:
            await asyncio.sleep(JOIN_PROGRESS_S)
            now, n = time.monotonic(), len(joined_at)
            print(
                f"  {n}/{len(indices)} joined after {now - t_join:.0f} s ({(n - done) / (now - since):.1f}/s lately)",
                flush=True,
            )
            done, since = n, now

    progress = asyncio.create_task(join_progress())
    try:
        await asyncio.gather(*(join(i) for i in indices))
    finally:
        progress.cancel()
    joined_s = time.monotonic() - t_join
    join_rates = join_rate_figures(joined_at, t_join)
    print(f"  {len(indices)} joined in {joined_s:.0f} s: {json.dumps(join_rates)}", flush=True)
    return joined_s, join_rates


async def spawn_agent_procs(
    root: Path, nodes: int, agent_procs: int, start_rate: float, module: str = "bench.light_agents_proc"
) -> dict[str, asyncio.subprocess.Process]:
    """The light agents of nodes 0 … nodes-1 shared out over `agent_procs` processes running `module`."""
    procs: dict[str, asyncio.subprocess.Process] = {}
    per = -(-nodes // agent_procs)
    for lo in range(0, nodes, per):
        procs[f"agents-{lo}"] = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            module,
            str(root),
            str(lo),
            str(min(nodes, lo + per)),
            str(start_rate / agent_procs),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
    return procs


async def agent_procs_ready(procs: dict[str, Any]) -> None:
    """Each agents' process's `ready N`: all its agents welcomed."""
    for name, p in procs.items():
        if name.startswith("agents-"):
            assert p.stdout is not None
            line = (await p.stdout.readline()).decode().strip()
            if not line.startswith("ready"):
                raise RuntimeError(f"{name} ended before its agents connected")


async def store_connected(admin: AdminClient, nodes: int) -> list[Any]:
    """Wait until the store lists `nodes` connected (it follows the agents by a liveness flush); those nodes."""
    while True:
        listed = await admin.list_nodes()
        up = [n for n in listed if n.state == "connected"]  # with --reuse of a larger fleet: these N
        if len(up) >= nodes:
            return up
        await asyncio.sleep(0.5)


async def rehome_after_kill(admin: AdminClient, procs: dict[str, Any], listed: list[Any]) -> dict[str, Any]:
    """SIGKILL gw-1; for each node it held, the time from the kill to its `node.connectivity connected` event
    on another gateway (stamped by the store's clock): how many re-homed, p50, p99, max."""
    held = {n.node_id for n in listed if n.gateway_id == "gw-1"}
    after = (await admin.server_info()).event_seq
    killed_ms = time.time() * 1000
    procs["gw-1"].send_signal(signal.SIGKILL)
    back: dict[str, float] = {}

    async def follow() -> None:
        async for ev in admin.watch(after_seq=after, type_prefix="node.connectivity"):
            d = json.loads(ev.data_json)
            if ev.subject in held and d.get("state") == "connected" and ev.subject not in back:
                back[ev.subject] = ev.at_ms - killed_ms
                if len(back) == len(held):
                    return

    await asyncio.wait_for(follow(), 600)
    secs = [ms / 1000 for ms in back.values()]
    return {
        "re_homed": len(secs),
        "p50_s": round(statistics.median(secs), 2),
        "p99_s": round(pct(secs, 0.99), 2),
        "max_s": round(max(secs), 2),
    }


async def idle_cpu(procs: dict[str, Any], settle_s: float) -> dict[str, Any]:
    """A connected fleet doing nothing: wait `settle_s` for the connect's tail (liveness flushes, first
    status, the agents' identity saves) to drain, then each process's CPU over the next `settle_s`, in
    percent of one core. It is what the fleet costs before anything happens, and the figures after it
    (the status window, the refresh, the re-home) start from that quiet fleet instead of the connect's tail."""
    if settle_s <= 0:
        return {}
    await asyncio.sleep(settle_s)
    pids = {name: p.pid for name, p in procs.items() if name.startswith(("gw-", "agents-"))}
    before = {name: cpu_s(pid) for name, pid in pids.items()}
    await asyncio.sleep(settle_s)
    used = {name: cpu_s(pid) - before[name] for name, pid in pids.items()}
    return {
        "idle_gateway_cpu_pct_of_a_core": [
            round(100 * v / settle_s) for k, v in sorted(used.items()) if k.startswith("gw-")
        ],
        "idle_agent_procs_cpu_pct_of_a_core": [
            round(100 * v / settle_s) for k, v in sorted(used.items()) if k.startswith("agents-")
        ],
    }


async def offer_status_in_procs(procs: dict[str, Any], every_s: float, for_s: float) -> int:
    """Ask every agents' process to offer its agents' status (`status EVERY FOR`); the reports they offered."""
    mine = [p for name, p in procs.items() if name.startswith("agents-")]
    for p in mine:
        p.stdin.write(f"status {every_s} {for_s}\n".encode())
        await p.stdin.drain()
    offered = 0
    for p in mine:
        line = (await p.stdout.readline()).decode().split()
        offered += int(line[1]) if len(line) == 2 and line[0] == "offered" else 0
    return offered


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=None, help="default 200 (with --reuse: the kept fleet's)")
    ap.add_argument("--url", default=PG_URL)
    ap.add_argument("--light", action="store_true", help="the simulator's agents (memory journal), for 1,000+")
    ap.add_argument("--status-every", type=float, default=0.0, help="before the kill: status writes, each node every S")
    ap.add_argument("--gateways", type=int, default=GATEWAYS, help="gateway processes (default 3)")
    ap.add_argument("--refresh", action="store_true", help="before the kill: one inventory.refresh to every node")
    ap.add_argument("--no-kill", action="store_true", help="skip the gateway kill and the re-home figures")
    ap.add_argument("--keep", action="store_true", help="keep the data dirs, the gateways' logs and the schema")
    ap.add_argument("--reuse", type=Path, default=None, help="the joined fleet a --keep run left in DIR: no joins")
    ap.add_argument("--agent-procs", type=int, default=1, help="--light agents in K processes of their own")
    ap.add_argument(
        "--start-rate", type=float, default=0.0, help="agents started a second, a rolling start (0: all at once)"
    )
    ap.add_argument(
        "--settle", type=float, default=SETTLE_S, help="once connected: wait S, then measure S of idle CPU (0: none)"
    )
    return ap


def main() -> None:
    args = parser().parse_args()
    # Thousands of agents in one process: their routine warnings (a redial, a refused stream) are the storm
    # being measured, not news; errors still print.
    logging.basicConfig(level=logging.ERROR)
    result = asyncio.run(
        run(
            args.nodes,
            args.url,
            light=args.light,
            status_every_s=args.status_every,
            gateways=args.gateways,
            refresh=args.refresh,
            kill=not args.no_kill,
            keep=args.keep,
            agent_procs=args.agent_procs,
            reuse=args.reuse,
            settle_s=args.settle,
            start_rate=args.start_rate,
        )
    )
    print("fleet on PostgreSQL:" if args.no_kill else "re-home after a gateway kill:", json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
