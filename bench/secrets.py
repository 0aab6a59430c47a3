"""Secret broker figures (issue 35) for `make bench`: printed, never asserted.

One in-process `bc serve` (real gRPC, mutual TLS, SQLite file) and N in-process agents on fake GPUs, each
with a telemetry section whose headers come from one secret (`headers_secret_ref`, scoped by a label).

1. A request's round trip: one node's `SecretClient.get` with nothing held, R times: a one-time P-256
   key, the signed request over the session, the gateway's call to the broker (signature check against
   the node's certificates, binding and scope checks, the value unsealed, a JWE made, a `secret.delivered`
   event committed), the JWE opened on the node.
2. A rotation: from just before `SetSecret` to every node holding the new version (the gateway's feed
   tells the sessions within its 1 s tick, each node asks again).

Usage: python -m bench.secrets [--nodes 20] [--requests 200] [--rotations 5]
       python -m bench.run --only secrets
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
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

NAME = "otlp-auth"


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


async def until(cond: Any, deadline_s: float, what: str) -> None:
    deadline = time.monotonic() + deadline_s
    while not cond():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not happen within {deadline_s} s")
        await asyncio.sleep(0.005)  # a poll of the agents' memory, on the shared loop


async def run(nodes: int = 20, requests: int = 200, rotations: int = 5) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="bc-bench-secrets-"))
    server = Server(
        ServeOptions(data_dir=root / "server", listen="127.0.0.1:0", heartbeat_interval_s=5.0), Seams.production()
    )
    await server.start()
    admin = AdminClient(OperatorConfig.load(server.operator_config), timeout_s=120)
    await admin.__aenter__()
    agents: list[Agent] = []
    tasks: list[asyncio.Task[None]] = []
    try:
        names = [f"n{i:03d}" for i in range(nodes)]
        await admin.set_secret(NAME, b"authorization=Bearer v1", labels=["bench=1"])
        section = json.dumps(
            {"otlp_endpoint": "http://127.0.0.1:9", "export_interval_s": 3600, "headers_secret_ref": NAME}
        )
        for n in names:
            tok = await admin.create_token(n)
            await join_node(server.address, tok.token, root / n)
            await admin.label_node(n, {"bench": "1"}, [])
            await admin.set_spec_section(n, "telemetry", section)
            agent = Agent(AgentOptions(data_dir=root / n, fake_hw="hgx-h100-8", heartbeat_interval_s=5.0))
            agents.append(agent)
            tasks.append(asyncio.create_task(agent.run(), name=f"agent-{n}"))

        def held(version: int) -> bool:
            return all(a.secrets is not None and a.secrets.version(NAME, "telemetry") == version for a in agents)

        await until(lambda: held(1), 120, "the first delivery to every node")
        first = agents[0]
        assert first.secrets is not None
        generation = first.applied_generation
        trips: list[float] = []
        for _ in range(requests):
            first.secrets.release("telemetry")
            t0 = time.monotonic()
            await first.secrets.get(NAME, "telemetry", generation)
            trips.append(time.monotonic() - t0)
        rotation: list[float] = []
        for version in range(2, rotations + 2):
            t0 = time.monotonic()
            await admin.set_secret(NAME, f"authorization=Bearer v{version}".encode())
            await until(lambda v=version: held(v), 60, f"version {version} on every node")  # type: ignore[misc]
            rotation.append(time.monotonic() - t0)
        return {
            "nodes": nodes,
            "requests": requests,
            "request_median_ms": round(statistics.median(trips) * 1000, 2),
            "request_p99_ms": round(percentile(trips, 99) * 1000, 2),
            "rotations": rotations,
            "rotation_all_nodes_median_s": round(statistics.median(rotation), 3),
            "rotation_all_nodes_max_s": round(max(rotation), 3),
        }
    finally:
        for a in agents:
            a.stopped.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        await admin.__aexit__(None, None, None)
        await server.stop()
        shutil.rmtree(root, ignore_errors=True)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m bench.secrets")
    ap.add_argument("--nodes", type=int, default=20)
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--rotations", type=int, default=5)
    return ap


async def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    figures = await run(args.nodes, args.requests, args.rotations)
    print("secret broker:", json.dumps(figures), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
