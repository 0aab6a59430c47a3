"""What the supervisor reports of each loop reaches the operator: `<data-dir>/loops.json` (read by `bc doctor`),
and the OTLP metrics `bc.server.loop.restarts` and `bc.server.loop.restarting`."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult, MetricsData

from agent.offload import inline
from bc.assembly.server import Seams, ServeOptions, Server
from bc.assembly.supervisor import RESTARTING, RUNNING, LoopState, Supervisor
from bc.assembly.telemetry import ServeTelemetry
from bc.control.doctor.checks import LOOPS_FILE
from bc.otel.config import OtlpConfig
from bc.seams import virtual_time


class Outage(Exception):
    pass


def test_the_supervisor_tells_each_change_of_a_loops_state() -> None:
    async def main() -> list[tuple[str, str, int]]:
        clock = virtual_time.virtual_clock()
        seen: list[tuple[str, str, int]] = []
        sup = Supervisor(
            clock,
            random.Random(1),
            on_change=lambda states: seen.extend((s.name, s.state, s.restarts) for s in states if s.name == "jobs"),
        )
        back = asyncio.Event()
        runs = 0

        async def jobs() -> None:
            nonlocal runs
            runs += 1
            if runs == 1:
                raise Outage("store down")
            back.set()
            await asyncio.Event().wait()

        sup.spawn("jobs", jobs)
        async with asyncio.timeout(600):
            await back.wait()
        await sup.stop()
        return seen

    assert virtual_time.run(main()) == [("jobs", RUNNING, 0), ("jobs", RESTARTING, 1), ("jobs", RUNNING, 1)]


async def test_bc_serve_writes_its_loops_for_doctor_and_removes_them_when_it_stops(tmp_path: Path) -> None:
    server = Server(ServeOptions(data_dir=tmp_path / "server", listen="127.0.0.1:0"), Seams.production())
    await server.start()
    try:
        async with asyncio.timeout(30):
            await server.loops_written.wait()
        doc = json.loads((tmp_path / "server" / LOOPS_FILE).read_text("utf-8"))
        assert doc["process"] == "serve"
        assert [lp["name"] for lp in doc["loops"]] == server.loops
        assert {lp["state"] for lp in doc["loops"]} == {RUNNING}
    finally:
        await server.stop()
    assert not (tmp_path / "server" / LOOPS_FILE).exists()


class Captured(MetricExporter):
    """The collector, in memory: each export's points by metric name, (attributes, value)."""

    def __init__(self) -> None:
        super().__init__()
        self.exports: list[dict[str, list[tuple[dict[str, Any], float]]]] = []
        self.exported = asyncio.Event()

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any) -> MetricExportResult:
        points: dict[str, list[tuple[dict[str, Any], float]]] = {}
        for rm in metrics_data.resource_metrics:
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    points[m.name] = [(dict(p.attributes or {}), p.value) for p in m.data.data_points]  # type: ignore[union-attr]
        self.exports.append(points)
        self.exported.set()
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        pass


def test_the_metrics_count_each_loops_restarts_and_say_which_are_restarting() -> None:
    async def main() -> list[dict[str, list[tuple[dict[str, Any], float]]]]:
        states = [LoopState("liveness", RESTARTING, restarts=3, last_error="StoreError: down"), LoopState("jobs")]

        async def no_nodes() -> dict[str, int]:
            return {}

        def loops() -> Sequence[LoopState]:
            return list(states)

        exporter = Captured()
        telemetry = ServeTelemetry(
            OtlpConfig("127.0.0.1:4317", "grpc", secure=False, interval_s=10),
            "gw-1",
            sessions=lambda: 0,
            published=lambda: 0,
            clock_offset_ms=lambda: 0,
            nodes_by_state=no_nodes,
            loops=loops,
            exporter=exporter,
            offload=inline,
        )
        task = asyncio.create_task(telemetry.run())
        async with asyncio.timeout(60):
            await exporter.exported.wait()
        exporter.exported.clear()
        states[0] = LoopState("liveness", RUNNING, restarts=5)  # restarted twice more, then back
        async with asyncio.timeout(60):
            await exporter.exported.wait()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return exporter.exports

    first, second = virtual_time.run(main())[:2]
    assert first["bc.server.loop.restarts"] == [({"bc.loop": "liveness"}, 3)]
    assert sorted(first["bc.server.loop.restarting"], key=str) == [
        ({"bc.loop": "jobs"}, 0),
        ({"bc.loop": "liveness"}, 1),
    ]
    assert second["bc.server.loop.restarts"] == [({"bc.loop": "liveness"}, 5)]  # a counter: cumulative
    assert dict((a["bc.loop"], v) for a, v in second["bc.server.loop.restarting"]) == {"jobs": 0, "liveness": 0}
