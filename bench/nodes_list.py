"""`bc nodes --json` at fleet size without a fleet (issue 38's row "`bc nodes --json` at 10,000 nodes").

A real store (an SQLite file, or a schema of its own on PostgreSQL with `--url`) is seeded with N nodes
(default 10,000) through the store's own functions, each as a joined node's rows look: a spec with
its sections, an open session, a Hello's inventory (the `hgx-h100-8` fake profile: 8 GPUs), a status
report, a node certificate, and a few GPU cordons. Then a real `bc serve --roles api` runs on it (no
gateway or worker: nothing writes while it is measured, and no liveness pass turns the seeded sessions
away), and `bc nodes --json` runs as an operator runs it, a new process each time. Printed, medians of
`--runs`: the wall time, the CLI's CPU, the server's CPU per call (/proc/PID/stat before and after),
the bytes on stdout; and the server-side time of the query alone, called in this process on the same
store: `query_alone_s` the unary `ListNodes`' one transaction (`queries.fleet`), `pages_alone_s` the
stream's pages (`queries.fleet_pages`), messages made, not sent.

Usage: python -m bench.nodes_list [--nodes 10000] [--runs 5] [--url postgresql://...] [--keep]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

from google.protobuf import json_format

from agent.hw.fake import FakeHardware
from bc.control.reads import queries
from bc.store import Store
from bc.store import health as health_sql
from bc.store import identity as identity_sql
from bc.store import nodes as nodes_sql
from bc.store.postgres import PostgresStore, drop_schema
from bc.store.sqlite import SqliteStore
from bench.fleet_figures import parse_loadavg, stat_cpu_s
from bench.run import Lab

SEED_BATCH = 500
"""Nodes seeded per transaction."""

GATEWAY = "gw-bench"


def _cert_pem() -> str:
    """One real node certificate's PEM (ECDSA P-256, as the CA issues): its size is what every row carries."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "node-00000")])
    now = __import__("datetime").datetime.now(__import__("datetime").UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "bc CA")]))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + __import__("datetime").timedelta(hours=24))
        .sign(key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM).decode()


def _spec(node_id: str) -> str:
    """A spec with the sections a GPU host's carries (devices, host, access), about 1 KB."""
    return json.dumps(
        {
            "devices": {
                "mig": {"enabled": False},
                "gpus": [{"index": i, "persistence": True, "power_limit_w": 700} for i in range(8)],
            },
            "host": {"hugepages_1g": 64, "sysctl": {"vm.swappiness": "1"}, "kernel_args": ["iommu=pt"]},
            "access": {"ssh": {"principals": ["ops", "oncall"]}, "node": node_id},
        },
        sort_keys=True,
    )


def _status(now_ms: int) -> str:
    """A status report's document as the gateway stores it: sections and conditions (about 1.5 KB)."""
    sections = [
        {"name": s, "generation": 1, "state": "Converged", "message": "", "hash": secrets.token_hex(16)}
        for s in ("devices", "host", "access", "instances", "telemetry")
    ]
    conditions = [
        {"type": t, "status": "False", "reason": "AsExpected", "message": "", "since_ms": now_ms - 3_600_000}
        for t in ("GpuUnhealthy", "DriverMismatch", "DiskPressure", "ClockSkew")
    ]
    return json.dumps({"sections": sections, "conditions": conditions, "instances": []}, sort_keys=True)


async def seed(store: Store, n: int, rng: random.Random, *, gateway_id: str = GATEWAY) -> None:
    """N nodes through the store's own writes (as a join, a spec write, a Hello and a report leave them),
    their sessions on `gateway_id` (a live gateway's, in a test whose `bc serve` runs its liveness pass)."""
    inv = FakeHardware("hgx-h100-8", "bench", rng=rng).inventory()
    inventory_json = json_format.MessageToJson(inv, preserving_proto_field_name=True)
    gpus = [g.uuid for g in inv.gpus]
    pem = _cert_pem()
    now_ms = await store.now_ms()
    for start in range(0, n, SEED_BATCH):
        async with store.transaction() as tx:
            for i in range(start, min(n, start + SEED_BATCH)):
                node_id = f"node-{i:05d}"
                await nodes_sql.ensure(tx, node_id, "node", now_ms)
                spec = _spec(node_id)
                await nodes_sql.write_spec(tx, node_id, 1, spec, secrets.token_hex(32), spec.encode(), b"s" * 64)
                await identity_sql.insert_cert(
                    tx,
                    serial=secrets.token_hex(16),
                    node_id=node_id,
                    identity_generation=1,
                    cert_pem=pem,
                    issued_at_ms=now_ms,
                    not_after_ms=now_ms + 86_400_000,
                )
                await nodes_sql.open_session(
                    tx,
                    node_id=node_id,
                    gateway_id=gateway_id,
                    journal_id=secrets.token_hex(8),
                    boot_id=secrets.token_hex(8),
                    incarnation_id=secrets.token_hex(8),
                    cert_serial="",
                    now_ms=now_ms,
                    hello=nodes_sql.HelloColumns(
                        applied_generation=1,
                        applied_spec_hash="",
                        capabilities_json=json.dumps(["gpu.reset", "inventory", "logs", "reboot"]),
                        labels_json=json.dumps({"rack": f"r{i // 40:03d}", "zone": f"z{i % 4}"}),
                        inventory_json=inventory_json,
                        inventory_hash=secrets.token_hex(16),
                    ),
                )
                await nodes_sql.write_status(tx, node_id, _status(now_ms))
                if i % 50 == 7:  # one node in 50 has a GPU cordoned by the health policy
                    await health_sql.cordon_gpu(tx, node_id, gpus[i % 8], "xid 79", None, False, "health", now_ms)


@asynccontextmanager
async def opened(url: str | None, path: Path) -> AsyncIterator[Store]:
    store: Store = PostgresStore(url, db_clock=True) if url else SqliteStore(path)
    await store.open()
    try:
        yield store
    finally:
        await store.close()


def _load() -> str:
    return parse_loadavg(Path("/proc/loadavg").read_text(), os.cpu_count() or 1).note()


def _cpu_s(pid: int) -> float:
    return stat_cpu_s(Path(f"/proc/{pid}/stat").read_text(), os.sysconf("SC_CLK_TCK"))


def _run_cli(argv: list[str], env: dict[str, str], *, quiet: bool = False) -> tuple[float, float, int]:
    """Wall and CPU seconds of one run of `argv` (a new process), and the bytes it printed on stdout; a failed
    run's stderr is copied to ours unless `quiet`."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        p = subprocess.Popen(argv, env=env, stdout=out, stderr=err)
        _pid, status, usage = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t0
        if os.waitstatus_to_exitcode(status) != 0:
            if quiet:
                raise subprocess.CalledProcessError(os.waitstatus_to_exitcode(status), argv)
            err.seek(0)
            sys.stderr.write(err.read().decode(errors="replace"))
            raise subprocess.CalledProcessError(os.waitstatus_to_exitcode(status), argv)
        return wall, usage.ru_utime + usage.ru_stime, out.tell()


async def _timed(fn: Callable[[], Coroutine[Any, Any, object]], runs: int) -> float:
    samples = []
    for _ in range(runs):
        t0 = time.perf_counter()
        await fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


async def _drain(pages: AsyncIterator[object]) -> None:
    async for _ in pages:
        pass


async def figures(nodes: int, runs: int, url: str | None, keep: bool) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="bc-bench-nodes-"))
    lab = Lab(root)
    schema = "bench_" + secrets.token_hex(4)
    store_url = f"{url}{'&' if '?' in url else '?'}schema={schema}" if url else None
    store_args = ["--store", store_url] if store_url else []
    try:
        # A first start makes the CA, the operator config and the store's schema; the store is seeded apart.
        serve_args = ["serve", "--data-dir", str(root / "server"), "--listen", lab.address, *store_args]
        first = lab.spawn("serve-init", *serve_args)
        cfg = root / "server" / "operator" / "config.json"
        for _ in range(600):
            if cfg.exists():
                break
            await asyncio.sleep(0.05)
        lab.stop()
        lab.procs.clear()
        assert first.returncode is not None
        t0 = time.perf_counter()
        async with opened(store_url, root / "server" / "bc.db") as store:
            await seed(store, nodes, random.Random(38))
            seed_s = time.perf_counter() - t0
            # The query alone, server side: the read and the messages, no gRPC, no CLI.
            query_s = await _timed(lambda: queries.fleet(store), runs)
            # `fleet_pages` is the stream's; a checkout before it (the figure before) has none.
            pages = getattr(queries, "fleet_pages", None)
            pages_s = await _timed(lambda: _drain(pages(store)), runs) if pages is not None else math.nan
        serve = lab.spawn("serve", *serve_args, "--roles", "api")
        env = dict(lab.env, BC_CONFIG=str(cfg))
        env.pop("PYTHONDONTWRITEBYTECODE", None)  # as installed: every module compiled already
        argv = [lab.bc, "nodes", "--json"]
        for _ in range(100):  # ready when it answers
            try:
                await asyncio.to_thread(lambda: _run_cli(argv, env, quiet=True))
                break
            except subprocess.CalledProcessError:
                await asyncio.sleep(0.2)
        samples = []
        for _ in range(runs):
            before = _cpu_s(serve.pid)
            wall, cpu, size = await asyncio.to_thread(_run_cli, argv, env)
            samples.append((wall, cpu, _cpu_s(serve.pid) - before, size))
        return {
            "nodes": nodes,
            "store": "postgresql" if url else "sqlite",
            "runs": runs,
            "wall_s": round(statistics.median(s[0] for s in samples), 3),
            "cli_cpu_s": round(statistics.median(s[1] for s in samples), 3),
            "server_cpu_s_per_call": round(statistics.median(s[2] for s in samples), 3),
            "bytes": samples[0][3],
            "query_alone_s": round(query_s, 3),
            "pages_alone_s": round(pages_s, 3),
            "seed_s": round(seed_s, 1),
            "load": _load(),
        }
    finally:
        lab.stop()
        if keep:
            print(f"  kept {root}" + (f"; schema {schema}" if url else ""), flush=True)
        else:
            if url:
                await drop_schema(url, schema)
            shutil.rmtree(root, ignore_errors=True)


def report(result: dict[str, Any]) -> None:
    print("bc nodes --json at fleet size:", json.dumps(result), flush=True)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=10_000)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--url", default=None, help="a PostgreSQL URL: a schema of its own there (dropped after)")
    ap.add_argument("--keep", action="store_true", help="keep the data dir (and schema) for a look afterwards")
    args = ap.parse_args(argv)
    report(asyncio.run(figures(args.nodes, args.runs, args.url, args.keep)))


if __name__ == "__main__":
    main()
