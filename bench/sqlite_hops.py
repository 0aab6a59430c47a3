"""What a statement costs by where it runs: aiosqlite (three trips to its thread a statement), one trip to a
thread, or on the loop. The figure behind `bc.store.sqlite.SqliteStore` running a write transaction's
statements on the loop (docs/design.md "Throughput"). `python -m bench.sqlite_hops [--n 5000]`."""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import aiosqlite

SELECT = "SELECT v FROM t WHERE id = :i"


def _one(conn: sqlite3.Connection, i: int) -> list[Any]:
    cur = conn.execute(SELECT, {"i": i})
    try:
        return cur.fetchall()
    finally:
        cur.close()


async def figures(n: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="bc-bench-hops-") as d:
        path = str(Path(d) / "t.db")
        with sqlite3.connect(path) as c:
            c.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)")
            c.executemany("INSERT INTO t VALUES (?, ?)", [(i, "x" * 50) for i in range(10_000)])
        out: dict[str, float] = {}
        conn = await aiosqlite.connect(path, isolation_level=None)
        t0 = time.perf_counter()
        for i in range(n):
            cur = await conn.execute(SELECT, {"i": i % 10_000})
            await cur.fetchall()
            await cur.close()
        out["aiosqlite_us"] = (time.perf_counter() - t0) / n * 1e6
        await conn.close()
        raw = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        thread = ThreadPoolExecutor(max_workers=1)
        loop = asyncio.get_running_loop()
        t0 = time.perf_counter()
        for i in range(n):
            await loop.run_in_executor(thread, _one, raw, i % 10_000)
        out["one_trip_us"] = (time.perf_counter() - t0) / n * 1e6
        t0 = time.perf_counter()
        for i in range(n):
            _one(raw, i % 10_000)
        out["on_loop_us"] = (time.perf_counter() - t0) / n * 1e6
        thread.shutdown()
        raw.close()
        return {k: round(v, 1) for k, v in out.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n", type=int, default=5000)
    print("microseconds a statement:", asyncio.run(figures(ap.parse_args().n)))


if __name__ == "__main__":
    main()
