"""Break-glass SSH figures (issue 18) for `make bench`: printed, never asserted.

Time from `bc ssh revoke` to the serial in the KRL of N fake nodes. One in-process `bc serve` (real
gRPC, mutual TLS, SQLite file) and N in-process agents on fake GPUs, each with its own SSH directory
and an `sshd_config` that includes its drop-in, so every pass runs the real tools (`ssh-keygen -k`,
`sshd -t`) on the real path: Admin `SshRevoke` -> every node's access section rewritten -> the gateway
sends each node its new spec -> the node's access converger rebuilds its KRL, `sshd -t` accepts it.

A sample is, for one revocation and one node, the time from just before the `SshRevoke` call to the end
of that node's converge pass whose section lists the serial (its KRL is on disk then: the converger
returns CONVERGED only after writing it and `sshd -t` accepting it). Also printed: the last node's time
per revocation (median) and the `SshRevoke` call alone (it rewrites and signs all N specs in one
transaction). The agents share one process and
one event loop with the server, on two shared cores: the KRL build and `sshd -t` subprocesses of all N
nodes queue behind each other, which is what the tail measures.

Usage: python -m bench.ssh [--nodes 100] [--revocations 5]
       python -m bench.run --only ssh
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from google.protobuf.message import Message

os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

from agent.app import Agent, AgentOptions
from agent.converge.run import CONVERGED, Converger, SectionResult
from agent.converge.sshd import find_tool
from agent.join import join_node
from bc.assembly.server import Seams, ServeOptions, Server
from bc.client.admin import AdminClient
from bc.pki import ssh as ssh_pki
from bc.pki.secrets_source import SystemSecrets
from bc.protocol.pb import admin_pb2, spec_pb2
from bc.runtime.config import OperatorConfig


class Timed:
    """The access converger, noting when a pass first converged with each serial in its section."""

    section = "access"

    def __init__(self, inner: Converger, seen: dict[int, float]) -> None:
        self.inner, self.seen = inner, seen

    async def converge(self, desired: Message, generation: int) -> SectionResult:
        result = await self.inner.converge(desired, generation)
        if result.state == CONVERGED:
            assert isinstance(desired, spec_pb2.AccessSection)
            now = time.monotonic()
            for s in desired.revoked_serials:
                self.seen.setdefault(int(s), now)
        return result


class TimedAgent(Agent):
    def __init__(self, opts: AgentOptions, seen: dict[int, float]) -> None:
        super().__init__(opts)
        self.seen = seen

    async def open(self) -> None:
        await super().open()
        self.convergers["access"] = Timed(self.convergers["access"], self.seen)


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def prepare() -> tuple[Path, Path]:
    """A scratch directory and one host key every node's sshd_config names."""
    root = Path(tempfile.mkdtemp(prefix="bc-bench-ssh-"))
    Path("/run/sshd").mkdir(exist_ok=True)  # sshd -t insists on its privilege separation directory
    host_key = root / "host_key"
    subprocess.run([find_tool("ssh-keygen"), "-q", "-t", "ed25519", "-N", "", "-f", str(host_key)], check=True)
    return root, host_key


def sshd_config(node_dir: Path, host_key: Path) -> Path:
    config = node_dir / "sshd_config"
    config.write_text(f"HostKey {host_key}\nInclude {node_dir / 'ssh' / 'sshd.conf'}\n")
    return config


async def run(nodes: int = 100, revocations: int = 5) -> dict[str, Any]:
    root, host_key = await asyncio.to_thread(prepare)
    server = Server(
        ServeOptions(data_dir=root / "server", listen="127.0.0.1:0", heartbeat_interval_s=5.0), Seams.production()
    )
    await server.start()
    admin = AdminClient(OperatorConfig.load(server.operator_config), timeout_s=120)
    await admin.__aenter__()
    agents: list[TimedAgent] = []
    tasks: list[asyncio.Task[None]] = []
    seen: dict[str, dict[int, float]] = {}
    try:
        names = [f"n{i:03d}" for i in range(nodes)]
        for n in names:
            tok = await admin.create_token(n)
            d = root / n
            await join_node(server.address, tok.token, d)
            config = await asyncio.to_thread(sshd_config, d, host_key)
            seen[n] = {}
            opts = AgentOptions(data_dir=d, fake_hw="hgx-h100-8", heartbeat_interval_s=5.0, sshd_config=config)
            agent = TimedAgent(opts, seen[n])
            agents.append(agent)
            tasks.append(asyncio.create_task(agent.run(), name=f"agent-{n}"))
        await admin.ssh_ca_init()
        user = ssh_pki.public_line(ssh_pki.new_ca_key(SystemSecrets()))
        serials = []
        for _ in range(revocations):
            g = await admin.ssh_grant(
                admin_pb2.SshGrantRequest(node_id=names[0], principal="oncall", public_key=user, ttl_s=3600)
            )
            serials.append(g.serial)
        samples: list[float] = []
        per_revoke: list[float] = []
        rpc: list[float] = []
        for serial in serials:
            t0 = time.monotonic()
            await admin.ssh_revoke(serial, reason="bench")
            rpc.append(time.monotonic() - t0)
            deadline = t0 + 300
            while not all(serial in seen[n] for n in names):
                if time.monotonic() > deadline:
                    missing = [n for n in names if serial not in seen[n]]
                    raise RuntimeError(f"serial {serial} never reached {len(missing)} node(s), e.g. {missing[:3]}")
                await asyncio.sleep(0.01)  # a poll of the agents' records, on the shared loop
            times = [seen[n][serial] - t0 for n in names]
            samples.extend(times)
            per_revoke.append(max(times))
        return {
            "nodes": nodes,
            "revocations": revocations,
            "samples": len(samples),
            "median_s": round(statistics.median(samples), 3),
            "p99_s": round(percentile(samples, 99), 3),
            "max_s": round(max(samples), 3),
            "last_node_median_s": round(statistics.median(per_revoke), 3),
            "revoke_rpc_median_s": round(statistics.median(rpc), 3),
        }
    finally:
        for a in agents:
            a.stopped.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        await admin.__aexit__(None, None, None)
        await server.stop()
        shutil.rmtree(root, ignore_errors=True)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m bench.ssh")
    ap.add_argument("--nodes", type=int, default=100)
    ap.add_argument("--revocations", type=int, default=5)
    return ap


async def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    figures = await run(args.nodes, args.revocations)
    print("bc ssh revoke -> serial in every node's KRL:", json.dumps(figures), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
