"""A gateway's memory per connected node session, heartbeats only (issue 38's row; docs/scale.md).

    python -m bench.session_mem [--sessions 100 300] [--url postgresql://...] [--settle 15] [--traced]
                                [--gateway-env NAME=VALUE ...]

One real `bc serve` (SQLite in its data dir, or a schema of its own on PostgreSQL with `--url`); the largest
step's nodes joined with real tokens; then the sessions held in steps by the fleet generator
(`bench.fleet_gen`: the production agent's session core over real gRPC and mutual TLS, fake hardware, a
memory journal), one generator process per step, so step k adds the nodes of step k-1 .. k. At each step,
once every node is connected in the store and `--settle` seconds have passed (a heartbeat each way, a
liveness flush, the first status write), the gateway's resident set is read (/proc/PID/status `VmRSS`, and
smaps_rollup's anonymous part) and printed beside the baseline taken after the joins, before any session:

* `kib_per_session`: (RSS now - RSS before any session) / sessions, what `bench.fleet` prints;
* `marginal_kib_per_session`: (RSS now - RSS at the step before) / sessions added, which leaves out what
  the first sessions pay once (code paths first run, pools first grown).

`--traced` runs the gateway under tracemalloc (`bench.serve_traced`), signalled once before the sessions and
once per step: the reports (Python's allocations by traceback, growth since before the sessions) are left
in the printed directory, and each step also prints `traced_kib_per_session`, Python's share of the growth;
the rest of the RSS growth is C (gRPC core, OpenSSL, the allocator's arenas), which tracemalloc does not
see. Its RSS figures include tracemalloc's own bookkeeping: read them from an untraced run.
`--heaptrack` runs the gateway under heaptrack (a dev tool, not a dependency; its LD_PRELOAD records every
malloc with its C stack) and kills it with SIGKILL after the last step, so every allocation still held,
the sessions' among them, shows as "leaked" in `heaptrack_print -l` of the file left in the printed
directory: grpc core's and BoringSSL's share by call stack, which tracemalloc cannot see. Its RSS figures
include heaptrack's own cost: read them from a plain run.
`--listen` has the agents take their tunnel offers on a `NodeTunnels.Listen` stream beside their session,
as an agent older than the offers on the session did (a second server call a node): what that stream costs
the gateway. `--no-tunnels` has them take no offers at all (a real node always does).
`--connections-only` opens each node's mutual-TLS channel from this process (as its agent dials) and
leaves it idle, with no stream and so no session: what a connection alone costs the gateway.
`--gateway-env NAME=VALUE` sets an environment variable for the gateway only (an allocator or gRPC setting
to try).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

import grpc

from agent.identity import Identity
from agent.session.grpc_dial import new_channel
from bc.client.admin import AdminClient
from bc.runtime.config import OperatorConfig
from bc.store.postgres import drop_schema
from bc.wire.tls import channel_credentials
from bench.fleet import load_now
from bench.fleet_figures import figure_line, kib_per_session
from bench.light_agents import TUNNELS_ENV
from bench.rehome import _listening, join_fleet, store_connected
from bench.run import Lab, rss_kib

SNAPSHOT_WAIT_S = 120.0


def smaps_anon_kib(pid: int) -> int:
    """The anonymous memory of a process's resident set (heap, arenas, stacks), KiB; 0 if unreadable."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Anonymous:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def threads_of(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    return 0


def traced_kib(report: str) -> float:
    """The traced total on a `bench.serve_traced` report's first line (`traced   1234.5 KiB ...`)."""
    return float(report.split()[1])


class Gateway:
    """The one `bc serve` being measured, optionally under tracemalloc."""

    def __init__(
        self, lab: Lab, root: Path, store: str | None, traced: bool, env: dict[str, str], heaptrack: bool = False
    ) -> None:
        self.lab, self.root, self.traced, self.heaptrack = lab, root, traced, heaptrack
        self.dumps = root / "tracemalloc"
        self.snapshots = 0
        argv = ["serve", "--data-dir", str(root / "server"), "--listen", lab.address]
        if store is not None:
            argv += ["--store", store, "--gateway-id", "gw-0"]
        if traced:
            self.dumps.mkdir()
            cmd = [sys.executable, "-m", "bench.serve_traced", str(self.dumps), *argv]
        else:
            cmd = [lab.bc, *argv]
        if heaptrack:
            cmd = ["heaptrack", "-o", str(root / "gw-0"), *cmd]
        log = open(root / "gw-0.log", "ab")  # noqa: SIM115  (the process's; closed with it)
        self.proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env={**lab.env, **env}, start_new_session=True
        )
        lab.procs.append(self.proc)
        self._pid = 0

    @property
    def pid(self) -> int:
        """The gateway's own process (under heaptrack, the script's child)."""
        if not self._pid:
            self._pid = traced_pid(self.proc.pid) if self.heaptrack else self.proc.pid
        return self._pid

    async def started(self) -> None:
        cfg = self.root / "server" / "operator" / "config.json"
        deadline = time.monotonic() + 60
        while not cfg.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"bc serve did not start: see {self.root / 'gw-0.log'}")
            await asyncio.sleep(0.05)
        await _listening(self.lab.port)

    async def snapshot(self) -> str:
        """Signal the traced gateway and wait for its report; the report's text."""
        path = self.dumps / f"snapshot-{self.snapshots}.txt"
        self.snapshots += 1
        os.kill(self.pid, signal.SIGUSR2)
        deadline = time.monotonic() + SNAPSHOT_WAIT_S
        while not path.exists():
            if time.monotonic() > deadline:
                raise SystemExit(f"no tracemalloc report at {path}")
            await asyncio.sleep(0.2)
        return path.read_text()

    def memory(self) -> dict[str, int]:
        pid = self.pid
        return {"rss_kib": rss_kib(pid), "anon_kib": smaps_anon_kib(pid), "threads": threads_of(pid)}


def children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (/proc/PID/task/*/children)."""
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        out += [int(c) for c in (task / "children").read_text().split()]
    return out


def traced_pid(wrapper: int) -> int:
    """The gateway under `heaptrack`'s script: the script's child running `serve` (not its data pipeline)."""
    for child in children(wrapper):
        if b"serve" in Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0"):
            return child
    raise SystemExit("no gateway process under heaptrack")


async def idle_connections(root: Path, address: str, nodes: range) -> list[grpc.aio.Channel]:
    """One mutual-TLS channel a node, as its agent dials (`agent.session.grpc_dial.new_channel`, its key pair),
    connected and then left idle: no stream, so no session. What a connection alone costs the gateway."""
    chans = []
    for i in nodes:
        d = root / f"r{i:05d}"
        ident = Identity.load(d)
        key, cert = (d / ident.files["key"]).read_bytes(), (d / ident.files["cert"]).read_bytes()
        chans.append(new_channel(address, channel_credentials(ident.read(d, "ca"), key, cert)))
    await asyncio.gather(*(asyncio.wait_for(c.channel_ready(), 120) for c in chans))
    return chans


async def spawn_generator(root: Path, first: int, end: int, tunnels: str = "session") -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bench.fleet_gen",
        str(root),
        str(first),
        str(end),
        "0",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        env={**os.environ, TUNNELS_ENV: tunnels},
    )


async def ready(gen: asyncio.subprocess.Process, timeout_s: float) -> None:
    assert gen.stdout is not None
    line = (await asyncio.wait_for(gen.stdout.readline(), timeout_s)).decode().strip()
    if not line.startswith("ready"):
        raise SystemExit("a generator process ended before its agents connected")


async def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    steps = sorted(set(args.sessions))
    root = Path(tempfile.mkdtemp(prefix="bc-bench-mem-"))
    schema = "bench_" + secrets.token_hex(4) if args.url else None
    lab = Lab(root)
    env = dict(kv.split("=", 1) for kv in args.gateway_env)
    gw = Gateway(lab, root, f"{args.url}?schema={schema}" if args.url else None, args.traced, env, args.heaptrack)
    gens: list[asyncio.subprocess.Process] = []
    channels: list[grpc.aio.Channel] = []
    out: list[dict[str, Any]] = []
    print(f"  data dir, logs and reports in {root}", flush=True)
    try:
        await gw.started()
        async with AdminClient(
            OperatorConfig.load(root / "server" / "operator" / "config.json"), timeout_s=120
        ) as admin:
            await join_fleet(admin, root, [lab.address], range(steps[-1]))
            await asyncio.sleep(args.settle)  # the joins' tail (their events, the first flushes) drained
            if args.traced:
                await gw.snapshot()
            base = prev = gw.memory()
            base_traced = prev_traced = traced_kib((gw.dumps / "snapshot-0.txt").read_text()) if args.traced else 0.0
            print(f"  before any session: {json.dumps(base)}", flush=True)
            done = 0
            for n in steps:
                t0 = time.monotonic()
                if args.connections_only:
                    channels += await idle_connections(root, lab.address, range(done, n))
                else:
                    tunnels = "none" if args.no_tunnels else "listen" if args.listen else "session"
                    gen = await spawn_generator(root, done, n, tunnels=tunnels)
                    gens.append(gen)
                    await ready(gen, args.connect_timeout)
                    await store_connected(admin, n)
                connect_s = time.monotonic() - t0
                await asyncio.sleep(args.settle)
                now = gw.memory()
                doc: dict[str, Any] = {
                    "sessions": n,
                    "connect_s": round(connect_s, 1),
                    "rss_mib": round(now["rss_kib"] / 1024, 1),
                    "rss_before_sessions_mib": round(base["rss_kib"] / 1024, 1),
                    "kib_per_session": round(kib_per_session(now["rss_kib"], base["rss_kib"], n), 1),
                    "marginal_kib_per_session": round(kib_per_session(now["rss_kib"], prev["rss_kib"], n - done), 1),
                    "anon_kib_per_session": round(kib_per_session(now["anon_kib"], base["anon_kib"], n), 1),
                    "threads": now["threads"],
                }
                if args.traced:
                    t = traced_kib(await gw.snapshot())
                    doc["traced_kib_per_session"] = round((t - base_traced) / n, 1)
                    doc["marginal_traced_kib_per_session"] = round((t - prev_traced) / (n - done), 1)
                    prev_traced = t
                out.append(doc)
                print(figure_line(f"gateway memory, {n} sessions", json.dumps(doc), load_now()), flush=True)
                prev, done = now, n
            if args.heaptrack:  # what is held now is what heaptrack reports as never freed
                os.kill(gw.pid, signal.SIGKILL)
                await asyncio.to_thread(gw.proc.wait)
        return out
    finally:
        for ch in channels:
            await ch.close()
        for g in gens:
            if g.stdin is not None and g.returncode is None:
                try:
                    g.stdin.write(b"stop\n")
                    await g.stdin.drain()
                except ConnectionError:
                    pass
            await g.wait()
        lab.stop()
        if args.keep or args.traced or args.heaptrack:
            print(f"  kept {root}", flush=True)
        else:
            shutil.rmtree(root, ignore_errors=True)
        if schema is not None:
            await drop_schema(args.url, schema)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, nargs="+", default=[100, 300], help="the steps: sessions held at each")
    ap.add_argument("--url", default=None, help="PostgreSQL (a schema of its own); default SQLite")
    ap.add_argument("--settle", type=float, default=15.0, help="seconds after each step's connect before reading")
    ap.add_argument("--connect-timeout", type=float, default=600.0)
    ap.add_argument("--traced", action="store_true", help="the gateway under tracemalloc (bench.serve_traced)")
    ap.add_argument(
        "--listen",
        action="store_true",
        help="the agents take their tunnel offers on a Listen stream, as an older agent does: what it costs",
    )
    ap.add_argument("--no-tunnels", action="store_true", help="the agents take no tunnel offers at all")
    ap.add_argument(
        "--connections-only", action="store_true", help="mutual-TLS connections without a stream: what one costs"
    )
    ap.add_argument("--heaptrack", action="store_true", help="the gateway under heaptrack (a dev tool)")
    ap.add_argument("--gateway-env", action="append", default=[], metavar="NAME=VALUE")
    ap.add_argument("--keep", action="store_true", help="keep the data dirs and logs")
    return ap


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    asyncio.run(run(args))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
