"""How many mutual-TLS handshakes a second one `bc serve` gateway completes (the reconnect storm's first cost).

One `bc serve` (SQLite lab, or `--store URL`), one joined node whose key pair every client presents, and
`--procs` client processes each keeping `--concurrency` dials in flight: a dial makes a secure channel,
waits until it is READY (TCP, the TLS handshake with the client certificate, HTTP/2 settings) and closes
it. The figure is READY channels a second over `--seconds`, with the gateway's CPU over the same window
(percent of one core, /proc). No Session stream is opened: this is the handshake alone, not admission.

`--creds-per-dial` builds the channel credentials anew for every dial, as the agent's dial did (each
`ssl_channel_credentials` is a new client SSL context: the key pair parsed again), to show what that costs
the client.

Usage: python -m bench.handshake [--procs 2] [--concurrency 64] [--seconds 10] [--creds-per-dial] [--store URL]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import grpc

from agent.identity import Identity
from agent.join import join_node
from bc.wire.tls import channel_credentials
from bench.run import Lab
from bench.throughput import cpu_s


async def dial_loop(addr: str, pair: tuple[bytes, bytes, bytes], concurrency: int, seconds: float, fresh: bool) -> int:
    """Dials in flight, `concurrency` at a time, for `seconds`: how many reached READY."""
    ca, key, cert = pair
    shared = channel_credentials(ca, key, cert)
    done = 0
    deadline = time.monotonic() + seconds

    async def one() -> None:
        nonlocal done
        while time.monotonic() < deadline:
            creds = channel_credentials(ca, key, cert) if fresh else shared
            ch = grpc.aio.secure_channel(addr, creds)
            try:
                await asyncio.wait_for(ch.channel_ready(), max(0.1, deadline - time.monotonic()))
                done += 1
            except TimeoutError:
                pass
            finally:
                await ch.close()

    await asyncio.gather(*(one() for _ in range(concurrency)))
    return done


def client_main(addr: str, node_dir: str, concurrency: int, seconds: float, fresh: bool) -> None:
    d = Path(node_dir)
    ident = Identity.load(d)
    pair = (ident.read(d, "ca"), ident.read(d, "key"), ident.read(d, "cert"))
    n = asyncio.run(dial_loop(addr, pair, concurrency, seconds, fresh))
    print(n, flush=True)


async def run(procs: int, concurrency: int, seconds: float, fresh: bool, store: str | None) -> dict[str, object]:
    root = Path(tempfile.mkdtemp(prefix="bc-bench-handshake-"))
    lab = Lab(root)
    try:
        args = ["serve", "--data-dir", str(root / "server"), "--listen", lab.address]
        if store:
            args += ["--store", store]
        p = lab.spawn("serve", *args)
        cfg = root / "server" / "operator" / "config.json"
        for _ in range(600):
            if cfg.exists():
                break
            await asyncio.sleep(0.05)
        async with lab.admin() as admin:
            tok = await admin.create_token("hs")
            await join_node(lab.address, tok.token, root / "hs")
        clients = [
            await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "bench.handshake",
                "--client",
                lab.address,
                str(root / "hs"),
                str(concurrency),
                str(seconds),
                "1" if fresh else "0",
                stdout=asyncio.subprocess.PIPE,
            )
            for _ in range(procs)
        ]
        cpu0, t0 = cpu_s(p.pid), time.monotonic()
        outs = [await c.communicate() for c in clients]
        cpu1, t1 = cpu_s(p.pid), time.monotonic()
        total = sum(int(o[0].decode().strip() or 0) for o in outs)
        return {
            "handshakes": total,
            "handshakes_per_s": round(total / seconds, 1),
            "gateway_cpu_pct_of_a_core": round(100 * (cpu1 - cpu0) / (t1 - t0)),
            "procs": procs,
            "concurrency": concurrency,
            "creds_per_dial": fresh,
            "gateway_pid": p.pid,
        }
    finally:
        lab.stop()
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--client":
        os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
        addr, node_dir, conc, secs, fresh = sys.argv[2:7]
        client_main(addr, node_dir, int(conc), float(secs), fresh == "1")
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--creds-per-dial", action="store_true")
    ap.add_argument("--store", default=None)
    a = ap.parse_args()
    print(json.dumps(asyncio.run(run(a.procs, a.concurrency, a.seconds, a.creds_per_dial, a.store))), flush=True)


if __name__ == "__main__":
    main()
