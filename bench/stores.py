"""The same figures on both stores (`make bench`, `--only stores`): SQLite (the lab) next to PostgreSQL.

1. The store paths one gateway runs per node, one node after another (bench.pg_drivers.measure): Hello
   transactions per second (what one gateway admits when the store is the bound), enqueue + dispatch,
   status writes.
2. `inventory.refresh` end to end through a real `bc serve` subprocess with in-process agents
   (bench.commands.commands_per_second), on its SQLite file and with `--store postgresql://…`.

Usage: python -m bench.stores [--nodes 200] [--e2e-nodes 10] [--url postgresql://postgres@127.0.0.1/test]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import shutil
import tempfile
from pathlib import Path
from typing import Any

from bc.store.postgres import PostgresStore, drop_schema
from bc.store.sqlite import SqliteStore
from bench.commands import commands_per_second
from bench.pg_drivers import PG_URL, measure


async def run(nodes: int, url: str, e2e_nodes: int = 10) -> dict[str, Any]:
    out: dict[str, Any] = {}
    tmp = Path(tempfile.mkdtemp(prefix="bc-bench-stores-"))
    schema = "bench_" + secrets.token_hex(4)
    try:
        out["store_paths"] = {
            "sqlite": await measure(SqliteStore(tmp / "bc.db"), nodes),
            "postgres": await measure(PostgresStore(url, schema=schema), nodes),
        }
    finally:
        await drop_schema(url, schema)
        shutil.rmtree(tmp, ignore_errors=True)
    e2e: dict[str, Any] = {"sqlite": await commands_per_second(e2e_nodes, 200)}
    schema = "bench_" + secrets.token_hex(4)
    try:
        e2e["postgres"] = await commands_per_second(e2e_nodes, 200, ("--store", f"{url}?schema={schema}"))
    finally:
        await drop_schema(url, schema)
    out[f"inventory_refresh_{e2e_nodes}_nodes_200_commands"] = e2e
    return out


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=200)
    ap.add_argument("--url", default=PG_URL)
    ap.add_argument("--e2e-nodes", type=int, default=10, help="nodes of the end-to-end inventory.refresh run")
    return ap


def main() -> None:
    args = parser().parse_args()
    print("stores:", json.dumps(asyncio.run(run(args.nodes, args.url, args.e2e_nodes))), flush=True)


if __name__ == "__main__":
    main()
