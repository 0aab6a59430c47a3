"""Tunnel throughput (issue 35) for `make bench`: printed, never asserted.

`bc port-forward` (the CLI, a subprocess, as an operator runs it) carrying 100 MiB each way to a TCP port on a
node's loopback: one in-process `bc serve` (real gRPC, mutual TLS, SQLite file) and one in-process agent on
fake GPUs, whose session channel carries the tunnel. On the node's port a sink reads everything, answers
with its SHA-256 (upload), then a source writes 100 MiB back (download). The bytes cross: the client socket ->
`bc port-forward` (TLS to the node) -> gRPC `Tunnels.Open` -> the gateway's relay (bounded buffers) -> gRPC
`NodeTunnels.Carry` on the node's own connection -> the agent (TLS) -> the local port, and back.

Also printed: the peak bytes the relay held for the tunnel (its per-direction bound is 256 KiB).

Usage: python -m bench.tunnel [--mib 100]
       python -m bench.run --only tunnel
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

from agent.app import Agent, AgentOptions
from agent.join import join_node
from bc.assembly.server import Seams, ServeOptions, Server
from bc.client.admin import AdminClient
from bc.runtime.config import OperatorConfig

CHUNK = 256 * 1024


async def _node_port(mib: int, got: dict[str, Any]) -> asyncio.Server:
    """Upload: read `mib` MiB, answer its SHA-256; download: then write `mib` MiB of zeros and close."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        h, n, want = hashlib.sha256(), 0, mib * 1024 * 1024
        while n < want:
            data = await reader.read(CHUNK)
            if not data:
                break
            h.update(data)
            n += len(data)
        got["received"] = n
        writer.write(h.hexdigest().encode())
        block = bytes(CHUNK)
        for _ in range(want // CHUNK):
            writer.write(block)
            await writer.drain()
        writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", 0)


async def _forward(env: dict[str, str], node_port: int) -> tuple[asyncio.subprocess.Process, int]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bc.cli.entry",
        "port-forward",
        "n1",
        f"0:{node_port}",
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stderr is not None
    line = (await asyncio.wait_for(proc.stderr.readline(), 30)).decode()
    if not line.startswith("forwarding 127.0.0.1:"):
        raise RuntimeError(f"bc port-forward said: {line.strip()}")
    return proc, int(line.split()[1].rsplit(":", 1)[1])


async def run(mib: int, where: Path | None = None) -> dict[str, Any]:
    """The figures; `where` holds the lab's files (default: a temporary directory, removed afterwards)."""
    root = Path(tempfile.mkdtemp(prefix="bc-bench-tunnel-", dir=where))
    server = Server(
        ServeOptions(data_dir=root / "server", listen="127.0.0.1:0", heartbeat_interval_s=1.0, tunnels=True),
        Seams.production(),
    )
    await server.start()
    assert server.operator_config is not None
    cfg = OperatorConfig.load(server.operator_config)
    agent: Agent | None = None
    task: asyncio.Task[None] | None = None
    proc: asyncio.subprocess.Process | None = None
    try:
        async with AdminClient(cfg) as admin:
            tok = await admin.create_token("n1")
            await join_node(server.address, tok.token, root / "n1")
            agent = Agent(AgentOptions(data_dir=root / "n1", fake_hw="hgx-h100-8", heartbeat_interval_s=1.0))
            task = asyncio.create_task(agent.run())
            async for ev in admin.watch(type_prefix="node.observed"):
                if ev.subject == "n1":
                    break
        got: dict[str, Any] = {}
        sink = await _node_port(mib, got)
        env = {**os.environ, "BC_CONFIG": str(server.operator_config)}
        proc, local = await _forward(env, int(sink.sockets[0].getsockname()[1]))
        reader, writer = await asyncio.open_connection("127.0.0.1", local)
        block, h = os.urandom(CHUNK), hashlib.sha256()
        t0 = time.perf_counter()
        for _ in range(mib * 1024 * 1024 // CHUNK):
            writer.write(block)
            h.update(block)
            await writer.drain()
        answer = await reader.readexactly(64)
        t1 = time.perf_counter()
        n = 0
        while data := await reader.read(CHUNK):
            n += len(data)
        t2 = time.perf_counter()
        writer.close()
        if answer.decode() != h.hexdigest() or n != mib * 1024 * 1024:
            raise RuntimeError(f"the bytes did not arrive whole: {got.get('received')} up, {n} down")
        hub = server.gateway.tunnels
        async with AdminClient(cfg) as admin:
            async for ev in admin.watch(type_prefix="tunnel.closed"):
                closed = json.loads(ev.data_json)
                break
        sink.close()
        return {
            "mib": mib,
            "upload_mib_s": round(mib / (t1 - t0), 1),
            "download_mib_s": round(mib / (t2 - t1), 1),
            "bytes_up_recorded": closed["bytes_up"],
            "bytes_down_recorded": closed["bytes_down"],
            "relay_bound_bytes": 2 * 256 * 1024,
            "open_relays_after": len(hub.relays),
        }
    finally:
        if proc is not None and proc.returncode is None:
            proc.terminate()
            await proc.wait()
        if agent is not None and task is not None:
            agent.stopped.set()
            await asyncio.wait_for(task, 10)
        await server.stop()
        shutil.rmtree(root, ignore_errors=True)


def figures(mib: int = 100) -> dict[str, Any]:
    return asyncio.run(run(mib))


def report(f: dict[str, Any]) -> str:
    return (
        f"tunnel (bc port-forward, {f['mib']} MiB each way, TLS end to end through the relay): "
        f"upload {f['upload_mib_s']} MiB/s, download {f['download_mib_s']} MiB/s"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=100)
    args = ap.parse_args()
    f = figures(args.mib)
    print(report(f))
    print(json.dumps(f, indent=2))


if __name__ == "__main__":
    main()
