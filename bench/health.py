"""Health and telemetry figures (issue 17), printed, never asserted.

1. telemetry CPU: the CPU time one export of the agent's metrics costs (an
   8-GPU node's gauges, a few commands and converge passes between exports),
   collected on the loop and exported from a thread to a real OTLP receiver on
   127.0.0.1, gRPC and HTTP; per minute at a 10 s interval is six exports.
   `time.process_time` counts every thread of the process, so the receiver's
   own decoding is counted too: an upper bound.
2. XID -> `bc nodes show`: `bc serve` and a fake node (`bc node --fake-hw
   hgx-h100-8`) as subprocesses; an XID is injected through the node's
   `fake-faults` file and the bench polls the Admin API's node view (what
   `bc nodes show` reads) every 20 ms until the GPU's condition reads False.
   A `gpu.reset` then clears it before the next sample. The node reads health
   every 2 s (agent.app.HEALTH_PASS_S), which bounds the figure.

Usage: python -m bench.run --only health   (or python -m bench.health [--samples 20] [--exports 60])
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from agent.health.readings import GpuReading
from agent.join import join_node
from agent.telemetry.loop import TelemetryLoop
from agent.telemetry.metrics import AgentMetrics, Gauges
from bc.otel.config import parse
from bench.stats import pct


def _gauges() -> Gauges:
    gpus = tuple(
        GpuReading(
            f"GPU-{i:08x}-0000-0000-0000-000000000000",
            ecc_volatile_uncorrected=0,
            ecc_volatile_corrected=1,
            ecc_aggregate_uncorrected=0,
            ecc_aggregate_corrected=12,
            utilization_pct=50.0 + i,
            memory_used_bytes=(40 + i) << 30,
            temperature_c=40.0 + i,
            power_w=300.0 + i,
        )
        for i in range(8)
    )
    return Gauges(journal_bytes=4096, unacked_events=2, session_connected=True, sessions_started=1, gpus=gpus)


async def telemetry_cpu(protocol: str, exports: int) -> dict[str, object]:
    from tests.otlp_receiver import grpc_receiver, http_receiver

    receiver = grpc_receiver() if protocol == "grpc" else http_receiver()
    metrics = AgentMetrics()
    snapshot = _gauges()

    async def gauges() -> Gauges:
        return snapshot

    with receiver as (port, received):
        loop = TelemetryLoop("n1", metrics, gauges, asyncio.to_thread)
        loop.configure(parse(f"http://127.0.0.1:{port}", protocol, 10))
        await loop._apply()
        await loop.tick()  # warm: imports, the channel, the first encode
        cpu = 0.0
        wall = 0.0
        for i in range(exports):
            for kind in ("inventory.refresh", "diag.nvml", "gpu.reset"):
                metrics.command_settled("control", kind, "succeeded", 0.01 * i)
            metrics.converge_pass({"host": 0.001, "devices": 0.002, "telemetry": 0.0001})
            c0, w0 = time.process_time(), time.perf_counter()
            ok = await loop.tick()
            cpu += time.process_time() - c0
            wall += time.perf_counter() - w0
            assert ok, "the receiver refused an export"
        await loop._close()
        size = received.requests[-1].ByteSize()
    per_export_ms = cpu / exports * 1000
    return {
        "protocol": protocol,
        "exports": exports,
        "cpu_ms_per_export": round(per_export_ms, 2),
        "cpu_ms_per_minute_at_10s": round(per_export_ms * 6, 1),
        "wall_ms_per_export": round(wall / exports * 1000, 2),
        "request_bytes": size,
    }


async def _until(check: Callable[[], Awaitable[bool]], interval_s: float, timeout_s: float = 60.0) -> None:
    for _ in range(int(timeout_s / interval_s)):
        if await check():
            return
        await asyncio.sleep(interval_s)
    raise TimeoutError(f"not within {timeout_s} s")


async def _is(value: Awaitable[str], want: str) -> bool:
    return await value == want


async def _settled(info: Awaitable[Any]) -> bool:
    return (await info).state in ("succeeded", "failed")


async def xid_to_show(samples: int) -> dict[str, object]:
    from bench.run import Lab

    root = Path(tempfile.mkdtemp(prefix="bc-bench-xid-"))
    lab = Lab(root)
    try:
        await lab.serve()
        async with lab.admin() as admin:
            tok = await admin.create_token("n1")
            await join_node(lab.address, tok.token, root / "n1")
            lab.spawn("n1", "node", "--data-dir", str(root / "n1"), "--fake-hw", "hgx-h100-8")

            async def gpu_status(uuid: str) -> str:
                node = await admin.get_node("n1")
                for c in node.conditions:
                    if c.type == f"GpuHealthy/{uuid}":
                        return c.status
                return ""

            for _ in range(500):
                node = await admin.get_node("n1")
                if node.inventory.gpus and await gpu_status(node.inventory.gpus[0].uuid) == "True":
                    break
                await asyncio.sleep(0.05)
            gpu = node.inventory.gpus[0].uuid
            faults = root / "n1" / "fake-faults"
            out: list[float] = []
            for i in range(samples):
                tmp = faults.with_name(".fake-faults.tmp")
                tmp.write_text(f"xid79:{gpu}\n# sample {i}\n")
                t0 = time.perf_counter()
                tmp.replace(faults)
                await _until(lambda: _is(gpu_status(gpu), "False"), 0.02)
                out.append((time.perf_counter() - t0) * 1000)
                faults.write_text("")
                cmd = await admin.run_command("n1", "gpu.reset", payload_json=json.dumps({"gpu_uuids": [gpu]}))
                await _until(lambda c=cmd.id: _settled(admin.get_command(c)), 0.05)
                await _until(lambda: _is(gpu_status(gpu), "True"), 0.05)
        out.sort()
        return {
            "samples": samples,
            "median_ms": round(statistics.median(out), 1),
            "p99_ms": round(pct(out, 0.99), 1),
            "min_ms": round(out[0], 1),
            "max_ms": round(out[-1], 1),
        }
    finally:
        lab.stop()
        shutil.rmtree(root, ignore_errors=True)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m bench.health")
    ap.add_argument("--samples", type=int, default=20, help="XIDs injected, one after another")
    ap.add_argument("--exports", type=int, default=60, help="exports timed per protocol")
    return ap


async def run(args: argparse.Namespace) -> None:
    for protocol in ("grpc", "http/protobuf"):
        print("telemetry export CPU:", json.dumps(await telemetry_cpu(protocol, args.exports)), flush=True)
    print("injected XID -> bc nodes show:", json.dumps(await xid_to_show(args.samples)), flush=True)


if __name__ == "__main__":
    asyncio.run(run(parser().parse_args()))
