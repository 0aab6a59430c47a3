"""Helpers of the duplicate-gateway-id security tests (issue 29): real `bc serve` processes on one PostgreSQL
schema, and the gateway lease's row as the store holds it."""

from __future__ import annotations

import subprocess
from pathlib import Path

import psycopg
from psycopg import sql

from tests.e2e.harness import Lab, free_port


def serve_gateway(lab: Lab, name: str, data_dir: Path, store: str, gateway_id: str, *extra: str) -> int:
    """`bc serve --gateway-id ID` as process `name` on the shared store; its port, once it accepts."""
    port = free_port()
    lab.serve(name, data_dir, port, store, "--gateway-id", gateway_id, *extra)
    return port


def run_serve(lab: Lab, data_dir: Path, store: str, gateway_id: str, *extra: str) -> subprocess.CompletedProcess[str]:
    """`bc serve` run to its end (a refused start)."""
    argv = [lab.bc_path, "serve", "--store", store, "--gateway-id", gateway_id, *extra, "--data-dir", str(data_dir)]
    argv += ["--listen", f"127.0.0.1:{free_port()}"]
    env = {**lab.env, "BC_DATA_DIR": str(data_dir)}
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60, stdin=subprocess.DEVNULL)


def lease_row(url: str, schema: str, name: str) -> tuple[str, int, int] | None:
    """(holder, expires_at_ms, epoch) of a lease, as the store holds it."""
    with psycopg.connect(url, autocommit=True) as conn:
        q = sql.SQL("SELECT holder, expires_at_ms, epoch FROM {}.leases WHERE name = %s").format(sql.Identifier(schema))
        row = conn.execute(q, (name,)).fetchone()
    return None if row is None else (str(row[0]), int(row[1]), int(row[2]))


def expire_lease(url: str, schema: str, name: str) -> None:
    """What a paused holder's lease looks like once its TTL passed: expired in the store."""
    with psycopg.connect(url, autocommit=True) as conn:
        q = sql.SQL("UPDATE {}.leases SET expires_at_ms = 0 WHERE name = %s").format(sql.Identifier(schema))
        conn.execute(q, (name,))


def count_events(url: str, schema: str, type_: str, subject: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        q = sql.SQL("SELECT COUNT(*) FROM {}.events WHERE type = %s AND subject = %s").format(sql.Identifier(schema))
        row = conn.execute(q, (type_, subject)).fetchone()
    return int(row[0]) if row else 0
