"""Self-update figures (issue 18) for `make bench`: printed, never asserted.

1. A fake rollout: `nodes` agents (fake GPUs, A/B slots in a temp dir, one process) under a real
   `bc serve` (gRPC, its HTTPS release server, SQLite) upgraded by the `release` job template with
   `--max-unavailable K`: the wall time from SubmitJob to the DAG's terminal state. Each node downloads the
   release over HTTPS, verifies it, swaps, "restarts" (a new Agent on the same dirs, started at once, as
   Restart=always would) and confirms on its first Welcome.
2. The download on loopback: `bc serve`'s release server (`bc.api.release_http`) sending a `size_mib` file,
   fetched by the agent's downloader (`agent.upgrade.download`: httpx, TLS under the bc CA, sha256 on the way,
   written to disk) and by `curl` (written to disk too) from the same server; MiB/s, the median of `runs`.
   The server runs in a process of its own (`python -m bench.release --serve`), as in a lab; curl is
   another process.

Usage: python -m bench.release [--nodes 20] [--max-unavailable 5] [--size-mib 256] [--runs 3]
       python -m bench.run --only release
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import hashlib
import json
import logging
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

from cryptography.hazmat.primitives.asymmetric import ed25519
from google.protobuf import json_format

from agent.app import Agent, AgentOptions, production_parts
from agent.join import join_node
from agent.upgrade.controller import UpgradeConfig
from agent.upgrade.download import download
from agent.upgrade.slots import install, read_disk
from bc.api.release_http import ReleaseServer, url_for
from bc.assembly.server import Seams, ServeOptions, Server
from bc.client.admin import AdminClient
from bc.pki import keys, releases
from bc.pki.ca import CertificateAuthority
from bc.pki.releases import upgrade_request
from bc.pki.secrets_source import SystemSecrets, os_seeded_random, p256_key
from bc.protocol.pb import admin_pb2
from bc.runtime.config import OperatorConfig
from bc.seams.clock import SystemClock


class Node:
    def __init__(self, root: Path, node_id: str) -> None:
        self.root, self.node_id = root, node_id
        self.data_dir = root / f"node-{node_id}"
        self.install_dir = root / f"install-{node_id}"
        self.agent: Agent | None = None
        self.task: asyncio.Task[None] | None = None
        self.restarts: asyncio.Queue[None] = asyncio.Queue()

    def start(self) -> None:
        disk = read_disk(self.install_dir)
        version = disk.record.slots[disk.current].version if disk.current in disk.record.slots else "1.0.0"
        opts = AgentOptions(
            data_dir=self.data_dir,
            fake_hw="hgx-h100-8",
            heartbeat_interval_s=1.0,
            install_dir=self.install_dir,
            upgrade=UpgradeConfig(confirm_s=60),
        )

        async def restart() -> None:
            self.restarts.put_nowait(None)

        parts = dataclasses.replace(production_parts(opts), version=version, restart=restart)
        self.agent = Agent(opts, parts)
        self.task = asyncio.create_task(self.agent.run())

    async def stop(self) -> None:
        if self.agent is not None and self.task is not None:
            self.agent.stopped.set()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.task, 10)

    async def supervise(self) -> None:
        """Restart=always: each restart request stops this Agent and starts the one `current` now names."""
        while True:
            await self.restarts.get()
            await self.stop()
            self.start()


async def rollout_figures(nodes: int, max_unavailable: int) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="bc-bench-release-"))
    server = Server(
        ServeOptions(
            data_dir=root / "server", listen="127.0.0.1:0", heartbeat_interval_s=1.0, release_listen="127.0.0.1:0"
        ),
        Seams.production(),
    )
    await server.start()
    admin = AdminClient(OperatorConfig.load(server.operator_config))
    fleet: list[Node] = []
    supervisors: list[asyncio.Task[None]] = []
    try:
        await admin.__aenter__()
        key = ed25519.Ed25519PrivateKey.generate()
        await admin.add_release_key(releases.public_bytes(key))
        await _until(lambda: bool(server.intent.release_keys))
        blob = root / "bc-1.1.0-linux-x86_64"
        # A script whose `--version` says 1.1.0 (checked before the swap), padded to 1 MiB with a comment.
        blob.write_bytes(b"#!/bin/sh\necho 'bc 1.1.0'\nexit 0\n# " + os.urandom(1 << 19).hex().encode() + b"\n")
        sha, size = releases.file_digest(blob)
        signed = releases.Release("bc", "1.1.0", 1, releases.host_platform(), sha, size)
        header = admin_pb2.PublishReleaseChunk(
            name=signed.name,
            version=signed.version,
            sequence=signed.sequence,
            platform=signed.platform,
            sha256=sha,
            size=size,
            signature=releases.sign(key, signed),
        )
        info = await admin.publish_release(header, blob)
        for i in range(nodes):
            n = Node(root, f"n{i:02d}")
            tok = await admin.create_token(n.node_id)
            await join_node(server.address, tok.token, n.data_dir)
            install(n.install_dir, b"1.0.0", version="1.0.0")
            n.start()
            fleet.append(n)
            supervisors.append(asyncio.create_task(n.supervise()))
        for n in fleet:
            assert n.agent is not None
            await asyncio.wait_for(n.agent.connected.wait(), 60)
        req = upgrade_request(info)
        t0 = time.perf_counter()
        job = await admin.submit_job(
            admin_pb2.SubmitJobRequest(
                template="release",
                nodes=[n.node_id for n in fleet],
                section="daemon",
                section_json=json_format.MessageToJson(req, indent=None),
                max_unavailable=max_unavailable,
            )
        )
        async for seen in admin.watch_job(job.id):
            job = seen
            if job.terminal:
                break
        wall = time.perf_counter() - t0
        confirmed = sum(read_disk(n.install_dir).record.state == "confirmed" for n in fleet)
        return {
            "nodes": nodes,
            "max_unavailable": max_unavailable,
            "waves": math.ceil(nodes / max_unavailable),
            "job_state": job.state,
            "confirmed": confirmed,
            "wall_s": round(wall, 2),
        }
    finally:
        for t in supervisors:
            t.cancel()
        for n in fleet:
            await n.stop()
        await admin.__aexit__(None, None, None)
        await server.stop()
        shutil.rmtree(root, ignore_errors=True)


async def download_figures(size_mib: int, runs: int) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="bc-bench-download-"))
    server: asyncio.subprocess.Process | None = None
    try:
        ca = CertificateAuthority.create(SystemClock(), os_seeded_random(), SystemSecrets())
        key = p256_key(SystemSecrets())
        cert = ca.issue_server_cert(["127.0.0.1"], key)
        served = root / "releases"
        served.mkdir()
        data = os.urandom(size_mib << 20)
        sha = hashlib.sha256(data).hexdigest()
        (served / sha).write_bytes(data)
        del data
        (root / "ca.pem").write_bytes(ca.ca_pem)
        (root / "cert.pem").write_bytes(keys.cert_to_pem(cert) + ca.ca_pem)
        (root / "key.pem").write_bytes(keys.key_to_pem(key))
        # The release server in its own process, as bc serve is: the client under test has this one.
        server = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bench.release", "--serve", str(root), stdout=asyncio.subprocess.PIPE
        )
        assert server.stdout is not None
        port = int((await server.stdout.readline()).decode().strip())
        url = url_for(f"127.0.0.1:{port}", sha)
        ours, curls = [], []
        for _ in range(runs):
            dest = root / "got"
            t0 = time.perf_counter()
            got = await download(url, dest, ca_pem=ca.ca_pem, max_size=size_mib << 20)
            ours.append(time.perf_counter() - t0)
            assert got.sha256 == sha
            dest.unlink()
            argv = ["curl", "-sS", "--cacert", str(root / "ca.pem"), "-o", str(dest), url]
            t0 = time.perf_counter()
            proc = await asyncio.create_subprocess_exec(*argv)
            assert await proc.wait() == 0
            curls.append(time.perf_counter() - t0)
            dest.unlink()
        return {
            "size_mib": size_mib,
            "runs": runs,
            "httpx_mib_s": round(size_mib / statistics.median(ours), 1),
            "curl_mib_s": round(size_mib / statistics.median(curls), 1),
            "curl_version": await asyncio.to_thread(_curl_version),
        }
    finally:
        if server is not None and server.returncode is None:
            server.terminate()
            await server.wait()
        shutil.rmtree(root, ignore_errors=True)


async def serve_forever(root: Path) -> None:
    """`--serve ROOT`: the release server over ROOT/releases with ROOT's cert and key; prints its port."""
    srv = ReleaseServer(root / "releases", (root / "cert.pem").read_bytes(), (root / "key.pem").read_bytes())
    print(await srv.start("127.0.0.1", 0), flush=True)
    await asyncio.Future()


def _curl_version() -> str:
    return subprocess.run(["curl", "--version"], capture_output=True, text=True).stdout.split()[1]


async def _until(pred: Callable[[], bool]) -> None:
    """The gateway's trust feed polls the store each second: poll its result the same way."""
    for _ in range(400):
        if pred():
            return
        await asyncio.sleep(0.05)
    raise TimeoutError("the release key never reached the server's bundle")


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description="Self-update figures")
    ap.add_argument("--nodes", type=int, default=20)
    ap.add_argument("--max-unavailable", type=int, default=5)
    ap.add_argument("--size-mib", type=int, default=256)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--part", choices=["rollout", "download"], default=None)
    ap.add_argument("--serve", type=Path, default=None, help=argparse.SUPPRESS)  # the download's server process
    return ap


async def run(args: argparse.Namespace) -> None:
    logging.disable(logging.WARNING)
    if args.serve is not None:
        return await serve_forever(args.serve)
    if args.part in (None, "rollout"):
        print("release rollout:", json.dumps(await rollout_figures(args.nodes, args.max_unavailable)), flush=True)
    if args.part in (None, "download"):
        print("release download:", json.dumps(await download_figures(args.size_mib, args.runs)), flush=True)


if __name__ == "__main__":
    asyncio.run(run(parser().parse_args()))
