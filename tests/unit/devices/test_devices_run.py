"""Run(): section order, the no-converger rule, retryable errors, and when a generation is observed."""

from __future__ import annotations

from dataclasses import dataclass, field

from google.protobuf.message import Message
from hypothesis import given
from hypothesis import strategies as st

from agent.converge.run import (
    CONVERGED,
    FAILED,
    PROGRESSING,
    UNSUPPORTED,
    Converger,
    SectionResult,
    is_settled,
    run,
)
from bc.protocol.canonical import SECTIONS
from bc.protocol.pb import common_pb2, session_pb2, spec_pb2

settled_results = st.one_of(
    st.builds(SectionResult, st.just(CONVERGED), terminal=st.booleans()),
    st.builds(SectionResult, st.just(UNSUPPORTED), terminal=st.booleans()),
    st.builds(SectionResult, st.just(FAILED), terminal=st.just(True)),
)
unsettled_results = st.one_of(
    st.builds(SectionResult, st.just(PROGRESSING), terminal=st.booleans()),
    st.builds(SectionResult, st.just(FAILED), terminal=st.just(False)),
    st.builds(SectionResult, st.just(common_pb2.SECTION_STATE_UNSPECIFIED)),
)


@given(st.lists(settled_results))
def test_settled_when_every_section_is_done(results: list[SectionResult]) -> None:
    assert is_settled(results)


@given(st.lists(settled_results), unsettled_results, st.lists(settled_results))
def test_one_unfinished_section_holds_the_generation_back(
    before: list[SectionResult], one: SectionResult, after: list[SectionResult]
) -> None:
    assert not is_settled([*before, one, *after])


@given(st.lists(st.one_of(settled_results, unsettled_results)))
def test_settled_is_all_of_its_parts(results: list[SectionResult]) -> None:
    assert is_settled(results) == all(is_settled([r]) for r in results)


@dataclass
class Recorder:
    """A converger that returns a fixed result (or raises) and records what it was given."""

    section: str
    result: SectionResult | Exception
    calls: list[tuple[Message, int]] = field(default_factory=list)

    async def converge(self, desired: Message, generation: int) -> SectionResult:
        self.calls.append((desired, generation))
        if isinstance(self.result, Exception):
            raise self.result
        return self.result


def by_section(statuses: list[common_pb2.SectionStatus]) -> dict[str, common_pb2.SectionStatus]:
    return {s.section: s for s in statuses}


async def test_empty_spec_without_convergers_is_observed() -> None:
    out = await run(spec_pb2.NodeSpec(), 3, {})
    assert [s.section for s in out.statuses] == list(SECTIONS)
    assert all(s.state == CONVERGED and s.generation == 3 for s in out.statuses)
    assert out.observed and out.events == []


async def test_a_section_without_converger_is_unsupported_but_terminal() -> None:
    spec = spec_pb2.NodeSpec(telemetry=spec_pb2.TelemetrySection(otlp_endpoint="http://otel:4317"))
    out = await run(spec, 4, {})
    st_ = by_section(out.statuses)["telemetry"]
    assert st_.state == UNSUPPORTED
    assert st_.reason == "SectionUnsupported"
    assert "field 5" in st_.message
    assert out.observed


async def test_a_converger_runs_even_for_an_empty_section() -> None:
    devices = Recorder("devices", SectionResult(CONVERGED))
    out = await run(spec_pb2.NodeSpec(), 7, {"devices": devices})
    assert len(devices.calls) == 1
    desired, generation = devices.calls[0]
    assert isinstance(desired, spec_pb2.DevicesSection) and generation == 7
    assert out.observed


async def test_a_converger_error_is_retryable() -> None:
    convergers: dict[str, Converger] = {"host": Recorder("host", RuntimeError("disk on fire"))}
    out = await run(spec_pb2.NodeSpec(), 2, convergers)
    host = by_section(out.statuses)["host"]
    assert host.state == PROGRESSING
    assert host.reason == "ConvergerError"
    assert "disk on fire" in host.message
    assert not out.observed


async def test_a_retryable_failure_is_reported_progressing() -> None:
    result = SectionResult(FAILED, reason="WriteFailed", message="EROFS", terminal=False)
    out = await run(spec_pb2.NodeSpec(), 2, {"devices": Recorder("devices", result)})
    devices = by_section(out.statuses)["devices"]
    assert (devices.state, devices.reason, devices.message) == (PROGRESSING, "WriteFailed", "EROFS")
    assert not out.observed


async def test_a_terminal_failure_lets_the_generation_be_observed_and_keeps_events_in_order() -> None:
    r1 = session_pb2.AllocationReport(allocation_id="a1", kind=session_pb2.AllocationReport.FAILED)
    r2 = session_pb2.AllocationReport(allocation_id="h1")
    convergers: dict[str, Converger] = {
        "devices": Recorder("devices", SectionResult(FAILED, "AllocationFailed", "a1: overlap", [r1], True)),
        "host": Recorder("host", SectionResult(CONVERGED, events=[r2])),
    }
    out = await run(spec_pb2.NodeSpec(), 9, convergers)
    assert by_section(out.statuses)["devices"].state == FAILED
    assert [e.allocation_id for e in out.events] == ["h1", "a1"]  # host comes before devices
    assert out.observed
