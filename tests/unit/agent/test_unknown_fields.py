"""An older agent meeting a newer spec: a field it does not know makes its section UNSUPPORTED with the number."""

from __future__ import annotations

from google.protobuf.message import Message

from agent.converge.run import CONVERGED, UNSUPPORTED, SectionResult, run
from agent.converge.unknown_fields import unknown_paths
from bc.protocol.pb import common_pb2, spec_pb2


def varint(n: int) -> bytes:
    out = b""
    while True:
        b, n = n & 0x7F, n >> 7
        out += bytes([b | (0x80 if n else 0)])
        if not n:
            return out


def field(number: int, payload: bytes) -> bytes:
    """A length-delimited field, as a newer writer would add one."""
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def newer_spec() -> spec_pb2.NodeSpec:
    """host.units[0] carries field 3, telemetry carries field 9, and NodeSpec itself field 8."""
    unit = spec_pb2.HostUnit(name="sysctl", settings_json="{}").SerializeToString() + field(3, b"x")
    host = field(1, unit)
    telemetry = spec_pb2.TelemetrySection(otlp_endpoint="http://c:4317").SerializeToString() + field(9, b"grpc")
    raw = field(1, host) + field(5, telemetry) + field(8, b"\x08\x01")
    spec = spec_pb2.NodeSpec()
    spec.ParseFromString(raw)
    return spec


class Always:
    def __init__(self, section: str) -> None:
        self.section = section
        self.calls = 0

    async def converge(self, desired: Message, generation: int) -> SectionResult:
        self.calls += 1
        return SectionResult(CONVERGED)


def test_unknown_paths_name_every_unknown_field_by_number() -> None:
    spec = newer_spec()
    assert unknown_paths(spec.host) == ["1.3"]
    assert unknown_paths(spec.telemetry) == ["9"]
    assert unknown_paths(spec) == ["1.1.3", "5.9", "8"]
    assert unknown_paths(spec_pb2.NodeSpec(host=spec.host)) == ["1.1.3"]  # a copy keeps them


async def test_a_section_with_an_unknown_field_is_unsupported_and_its_converger_does_not_run() -> None:
    host = Always("host")
    outcome = await run(newer_spec(), 7, {"host": host})
    by = {s.section: s for s in outcome.statuses}
    assert host.calls == 0
    assert by["host"].state == UNSUPPORTED and by["host"].reason == "UnknownFields"
    assert by["host"].message == "section host (NodeSpec field 1) has fields this agent does not know: 1.1.3"
    assert by["telemetry"].state == UNSUPPORTED and "5.9" in by["telemetry"].message
    assert by["field-8"].state == UNSUPPORTED and by["field-8"].message == (
        "NodeSpec field 8 is a section this agent does not know"
    )
    assert by["devices"].state == CONVERGED
    assert all(s.generation == 7 for s in outcome.statuses)
    assert outcome.observed  # UNSUPPORTED is terminal: the rest of the spec is not held back


async def test_a_spec_it_knows_whole_converges_as_before() -> None:
    host = Always("host")
    spec = spec_pb2.NodeSpec(host=spec_pb2.HostSection(units=[spec_pb2.HostUnit(name="sysctl")]))
    outcome = await run(spec, 1, {"host": host})
    assert host.calls == 1
    assert [s.section for s in outcome.statuses] == [
        "host",
        "devices",
        "instances",
        "access",
        "telemetry",
        "daemon",
        "site",
    ]
    assert {s.state for s in outcome.statuses} == {common_pb2.CONVERGED}
