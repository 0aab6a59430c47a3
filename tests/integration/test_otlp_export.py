"""The agent's telemetry loop against real OTLP receivers on 127.0.0.1 (gRPC and HTTP), and a dead one.

The loop is driven tick by tick (a tick is what the agent's timer does), so
nothing waits on an interval; the receivers decode with opentelemetry-proto.
"""

from __future__ import annotations

import asyncio
import logging
import socket

import pytest

from agent.health.readings import GpuReading
from agent.telemetry.converger import TelemetryConverger
from agent.telemetry.loop import TelemetryLoop
from agent.telemetry.metrics import AgentMetrics, Gauges
from bc.otel import export
from bc.otel.config import parse
from bc.protocol.pb import common_pb2, spec_pb2
from tests.otlp_receiver import Received, grpc_receiver, http_receiver

GPU = "GPU-11111111-2222-3333-4444-555555555555"
EXPECTED = {
    "bc.agent.commands",
    "bc.agent.command.duration",
    "bc.agent.converge.duration",
    "bc.agent.journal.size",
    "bc.agent.journal.unacked_events",
    "bc.agent.session.connected",
    "bc.agent.session.reconnects",
    "bc.gpu.utilization",
    "bc.gpu.memory.used",
    "bc.gpu.temperature",
    "bc.gpu.power",
    "bc.gpu.ecc.errors",
}


async def gauges() -> Gauges:
    gpu = GpuReading(
        GPU,
        ecc_volatile_uncorrected=0,
        ecc_volatile_corrected=2,
        ecc_aggregate_uncorrected=1,
        ecc_aggregate_corrected=7,
        utilization_pct=42.0,
        memory_used_bytes=1 << 30,
        temperature_c=35.0,
        power_w=88.5,
    )
    return Gauges(journal_bytes=1234, unacked_events=3, session_connected=True, sessions_started=3, gpus=(gpu,))


def _metrics() -> AgentMetrics:
    m = AgentMetrics()
    m.command_settled("control", "gpu.reset", "succeeded", 0.25)
    m.command_settled("diag", "diag.nvml", "failed", 1.5)
    m.converge_pass({"devices": 0.01, "telemetry": 0.0})
    return m


def _check(received: Received) -> None:
    assert received.names() >= EXPECTED, sorted(EXPECTED - received.names())
    (_attrs, value, resource), *_ = received.points("bc.agent.journal.size")
    assert value == 1234
    assert resource["service.name"] == "bc-node" and resource["bc.node_id"] == "n1" and resource["site"] == "lab"
    commands = {(a["bc.lane"], a["bc.kind"], a["bc.state"]): v for a, v, _ in received.points("bc.agent.commands")}
    assert commands == {("control", "gpu.reset", "succeeded"): 1, ("diag", "diag.nvml", "failed"): 1}
    assert {a["bc.kind"] for a, _, _ in received.points("bc.agent.command.duration")} == {"gpu.reset", "diag.nvml"}
    assert {a["bc.section"] for a, _, _ in received.points("bc.agent.converge.duration")} == {"devices", "telemetry"}
    assert [v for _, v, _ in received.points("bc.agent.session.reconnects")] == [2]
    (util,) = received.points("bc.gpu.utilization")
    assert util[0] == {"gpu.uuid": GPU, "gpu.index": 0} and util[1] == 42.0
    ecc = {(a["ecc.type"], a["ecc.counter"]): v for a, v, _ in received.points("bc.gpu.ecc.errors")}
    assert ecc == {
        ("corrected", "volatile"): 2,
        ("uncorrected", "volatile"): 0,
        ("corrected", "aggregate"): 7,
        ("uncorrected", "aggregate"): 1,
    }


async def _export_once(endpoint: str, protocol: str) -> TelemetryLoop:
    loop = TelemetryLoop("n1", _metrics(), gauges, asyncio.to_thread)
    section = spec_pb2.TelemetrySection(otlp_endpoint=endpoint, protocol=protocol, export_interval_s=10)
    section.resource_attributes["site"] = "lab"
    result = await TelemetryConverger(loop).converge(section, 1)
    assert result.state == common_pb2.CONVERGED, result
    await loop._apply()
    assert await loop.tick()
    return loop


async def test_the_agent_exports_its_metrics_over_otlp_grpc() -> None:
    with grpc_receiver() as (port, received):
        loop = await _export_once(f"http://127.0.0.1:{port}", "")
        try:
            _check(received)
        finally:
            await loop._close()


async def test_the_agent_exports_its_metrics_over_otlp_http() -> None:
    with http_receiver() as (port, received):
        loop = await _export_once(f"http://127.0.0.1:{port}", "http/protobuf")
        try:
            _check(received)
        finally:
            await loop._close()


async def test_a_bad_endpoint_fails_the_section_and_stops_the_export() -> None:
    loop = TelemetryLoop("n1", AgentMetrics(), gauges, asyncio.to_thread)
    conv = TelemetryConverger(loop)
    assert (await conv.converge(spec_pb2.TelemetrySection(otlp_endpoint="http://127.0.0.1:4317"), 1)).state == (
        common_pb2.CONVERGED
    )
    assert loop.config is not None
    bad = await conv.converge(spec_pb2.TelemetrySection(otlp_endpoint="collector 4317"), 2)
    assert (bad.state, bad.terminal, bad.reason) == (common_pb2.FAILED, True, "BadEndpoint")
    assert "is not a URL" in bad.message and loop.config is None
    refs = await conv.converge(
        spec_pb2.TelemetrySection(otlp_endpoint="http://127.0.0.1:4317", headers_secret_ref="vault:x"), 3
    )
    assert (refs.state, refs.reason) == (common_pb2.UNSUPPORTED, "FieldUnsupported") and "field 4" in refs.message


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_an_unreachable_collector_costs_a_bounded_buffer_and_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    assert export.MAX_BUFFER_BYTES == 1 << 20
    cfg = parse(f"http://127.0.0.1:{_closed_port()}", "http/protobuf", 1)
    loop = TelemetryLoop("n1", _metrics(), gauges, asyncio.to_thread)
    pipeline = export.OtlpPipeline(
        cfg,
        {"service.name": "bc-node"},
        asyncio.to_thread,
        max_buffer_bytes=8 << 10,
        exporter=export.make_exporter(cfg, 0.05),
    )
    loop.pipeline, loop.config = pipeline, cfg
    loop._register(pipeline)
    caplog.set_level(logging.INFO, logger="bc.otel")
    try:
        for _ in range(12):
            assert not await loop.tick()
            assert pipeline.buffered_bytes <= 8 << 10
        assert pipeline.dropped > 0 and pipeline.exported == 0
        warnings = [r for r in caplog.records if "otlp.export-failed" in r.getMessage()]
        assert len(warnings) == 1, [r.getMessage() for r in caplog.records]
    finally:
        await loop._close()
