"""`bc tui` figures at 1,000 nodes, on the seeded in-memory source (tui.fake), headless.

* one update: the time to apply one node's new reply to the fleet table (model + the cells
  that changed), median and p99 over 500 updates; the goal is p99 < 16 ms (one frame);
* start-up: from the app's start to the first full render of 1,000 rows;
* CPU: the process's CPU use over 5 s idle (the one-second age tick only) and over 5 s of
  100 events a second (each marks a node dirty; the feed reads it again and the row updates).

Headless: Textual lays out and renders each frame as in a terminal and discards the bytes, so
the terminal's own drawing is not counted. Figures are printed, never asserted.

Usage: python -m bench.tui [--nodes 1000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time

from bc.seams.clock import SystemClock
from bench.stats import pct
from tui.app import BcTui
from tui.fake import FakeSource
from tui.fleet_table import FleetTable


async def figures(nodes: int) -> dict[str, object]:
    source = FakeSource(random.Random(1), nodes=nodes)
    app = BcTui(source.connect, SystemClock(), server="fake:0", poll_s=3600.0)
    t0 = time.perf_counter()
    async with app.run_test(size=(120, 40)) as pilot:
        table = app.screen.query_one(FleetTable)
        while table.row_count < nodes:
            await pilot.pause(0.001)
        await pilot.pause()
        startup_ms = (time.perf_counter() - t0) * 1000
        while any(not r.detail for r in app.state.rows.values()):
            await pilot.pause(0.01)

        rng = random.Random(2)
        ids = sorted(app.state.rows)
        apply_ms = []
        for i in range(500):
            info = await source.get_node(rng.choice(ids))
            info.last_seen_age_ms = i
            info.generation += 1
            t = time.perf_counter()
            app.state.on_node(info, app.clock.monotonic())
            table.update_nodes({info.node_id}, app.clock.monotonic())
            apply_ms.append((time.perf_counter() - t) * 1000)
            if i % 50 == 0:
                await pilot.pause()

        c0, w0 = time.process_time(), time.perf_counter()
        await asyncio.sleep(5)
        idle = (time.process_time() - c0) / (time.perf_counter() - w0)

        c0, w0 = time.process_time(), time.perf_counter()
        for _ in range(500):
            source.publish("node.status", rng.choice(ids), '{"applied_generation": 1}')
            await asyncio.sleep(0.01)
        busy = (time.process_time() - c0) / (time.perf_counter() - w0)
        await pilot.press("q")
    return {
        "nodes": nodes,
        "update_ms_median": round(statistics.median(apply_ms), 3),
        "update_ms_p99": round(pct(apply_ms, 0.99), 3),
        "startup_to_first_full_render_ms": round(startup_ms, 1),
        "cpu_idle_pct": round(idle * 100, 1),
        "cpu_100_events_per_s_pct": round(busy * 100, 1),
    }


async def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=1000)
    args = ap.parse_args(argv)
    print("bc tui:", json.dumps(await figures(args.nodes)), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
