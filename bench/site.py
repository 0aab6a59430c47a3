"""The site role's figures (docs/metal.md, "Figures"): `python -m bench.site [--mib 256] [--queries 20]`.

* `bmc.query` through the kind, against sushy-tools' emulator behind the test edge (tests/redfish_bmc.py):
  median and max of N round trips (each opens the BMC, reads the service root and the system);
* the image cache pulling an image of `--mib` MiB from an HTTP server on loopback, digest checked;
* the boot server serving it: one GET of `/images/<sha256>` end to end, which re-hashes the file first.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import statistics
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
from google.protobuf import any_pb2

from agent.hw.fake import FakeHardware
from agent.kinds.base import KindContext
from agent.offload import to_thread
from agent.site.leases import Lease
from agent.site.role import site_executors
from agent.site.state import SiteOptions, SiteState
from bc.protocol.pb import site_kinds_pb2, spec_pb2
from bc.seams.clock import SystemClock
from tests.redfish_bmc import SYSTEM_MAC, redfish_bmc


async def queries(tmp: Path, n: int) -> list[float]:
    (tmp / "bmc").mkdir()
    with redfish_bmc(tmp / "bmc") as bmc:
        creds = tmp / "creds.json"
        creds.write_text(json.dumps({"default": {"username": "admin", "password": "old-password"}}))
        creds.chmod(0o600)
        site = SiteState(tmp / "data", SystemClock(), to_thread, SiteOptions(run_dnsmasq=False))
        site.section = spec_pb2.SiteSection(
            machines=[spec_pb2.SiteMachine(name="m1", bmc_url=bmc.url, macs=[SYSTEM_MAC])],
            credentials_file=str(creds),
        )
        ex = site_executors(site)["bmc.query"]
        hw = FakeHardware("hgx-h100-8", "site", state_dir=tmp / "hw")
        ctx = KindContext(node_id="site", data_dir=tmp / "data", hw=hw, cdi_dir=tmp / "cdi", boot_id="b")
        payload = any_pb2.Any()
        payload.Pack(site_kinds_pb2.BmcQueryRequest(machine="m1"))
        out = []
        for _ in range(n):
            started = time.perf_counter()
            r = await ex.run(ctx, ex.parse(payload))
            assert r.ok, r.message
            out.append(time.perf_counter() - started)
        return out


async def image(tmp: Path, mib: int) -> tuple[float, float]:
    data = bytes(range(256)) * (4096 * mib)
    digest = hashlib.sha256(data).hexdigest()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    done = asyncio.Event()
    site = SiteState(tmp / "data2", SystemClock(), to_thread, SiteOptions(run_dnsmasq=False), wake=done.set)
    try:
        started = time.perf_counter()
        site.cache.warm([(f"http://127.0.0.1:{server.server_address[1]}/img", digest)], 1)
        await done.wait()
        pull = time.perf_counter() - started
        site.section = spec_pb2.SiteSection(boot=spec_pb2.SiteBootServer(http_address="127.0.0.1:18099"))
        site.leases = {"m": Lease("m", ("52:54:00:00:00:01",), digest, digest, "", time.time() + 600)}
        await site.sync_boot()
        started = time.perf_counter()
        async with httpx.AsyncClient(trust_env=False, timeout=120) as c:
            r = await c.get(f"http://127.0.0.1:18099/images/{digest}")
        serve = time.perf_counter() - started
        assert r.status_code == 200 and len(r.content) == len(data)
        return pull, serve
    finally:
        await site.close()
        server.shutdown()


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--mib", type=int, default=256)
    p.add_argument("--queries", type=int, default=20)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as d:
        q = await queries(Path(d), args.queries)
        pull, serve = await image(Path(d), args.mib)
    print(f"bmc.query x{len(q)}: median {statistics.median(q) * 1000:.0f} ms, max {max(q) * 1000:.0f} ms")
    print(f"cache pull {args.mib} MiB: {pull:.2f} s ({args.mib / pull:.0f} MiB/s, digest checked)")
    print(f"serve {args.mib} MiB (re-hash + send): {serve:.2f} s ({args.mib / serve:.0f} MiB/s)")


if __name__ == "__main__":
    asyncio.run(main())
