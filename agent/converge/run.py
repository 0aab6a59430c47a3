"""Run(): one convergence pass over every NodeSpec section, in order.

The reference's rule: `observed_generation` advances to a spec's generation
only when every section has converged or failed terminally. A retryable
failure keeps its section PROGRESSING and the next pass tries again. A
section this agent has no converger for converges trivially when empty and
is UNSUPPORTED (terminal) otherwise, so one unknown section never holds back
the rest of the spec. The settling rule is the pure `is_settled`, kept apart
so it can be tested on its own.

A section holding fields this agent does not know (an older agent meeting a
newer spec, agent.converge.unknown_fields) is UNSUPPORTED with their field
numbers, without running its converger: enforcing part of a section and
calling it converged would let `observed_generation` claim what is not
enforced. A NodeSpec field the agent does not know at all is reported as a
section of its own, `field-<n>`, UNSUPPORTED.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from google.protobuf.message import Message

from agent.converge.unknown_fields import unknown_numbers, unknown_paths
from bc.protocol.canonical import SECTIONS, section_is_empty
from bc.protocol.pb import common_pb2, session_pb2, spec_pb2

log = logging.getLogger(__name__)

CONVERGED = common_pb2.CONVERGED
PROGRESSING = common_pb2.PROGRESSING
FAILED = common_pb2.FAILED
UNSUPPORTED = common_pb2.UNSUPPORTED

REASON_UNSUPPORTED = "SectionUnsupported"
REASON_CONVERGER_ERROR = "ConvergerError"
REASON_UNKNOWN_FIELDS = "UnknownFields"


@dataclass
class SectionResult:
    """What one converger pass over one section came to.

    FAILED with `terminal=True` is done for this generation (it counts as
    settled); FAILED with `terminal=False` is a retryable failure, reported
    as PROGRESSING with its reason and tried again on the next pass.
    `events` are the allocation reports the pass produced, to be journaled.
    """

    state: common_pb2.SectionState
    reason: str = ""
    message: str = ""
    events: list[session_pb2.AllocationReport] = field(default_factory=list)
    terminal: bool = False

    @property
    def reported_state(self) -> common_pb2.SectionState:
        """The state on the wire: a retryable FAILED is PROGRESSING."""
        if self.state == FAILED and not self.terminal:
            return PROGRESSING
        return self.state


class Converger(Protocol):
    section: str

    async def converge(self, desired: Message, generation: int) -> SectionResult: ...


@dataclass
class RunOutcome:
    """A pass's statuses (one per section, in order), its events, and whether the generation is observed."""

    statuses: list[common_pb2.SectionStatus]
    events: list[session_pb2.AllocationReport]
    observed: bool
    durations: dict[str, float] = field(default_factory=dict)
    """Seconds each section's converger took this pass, on the loop's clock (telemetry)."""


def is_settled(results: Iterable[SectionResult]) -> bool:
    """Whether a pass's results let observed_generation advance.

    Settled: every section CONVERGED, UNSUPPORTED, or FAILED terminally.
    Anything else (PROGRESSING, a retryable FAILED, an unset state) is not.
    """
    for r in results:
        if r.state in (CONVERGED, UNSUPPORTED):
            continue
        if r.state == FAILED and r.terminal:
            continue
        return False
    return True


def field_number(section: str) -> int:
    """The section's field number in NodeSpec (what SectionUnsupported names)."""
    return int(spec_pb2.NodeSpec.DESCRIPTOR.fields_by_name[section].number)


class UnknownFieldsMemo:
    """The unknown fields of the spec last asked about, kept while it is the same object.

    The drift pass runs every 10 s against a spec that changes only when a new one is accepted (which
    replaces the object), and walking every message for unknown fields each time was a few per cent of a
    simulated fleet's time. Holding the spec keeps its id from being reused while it is remembered."""

    def __init__(self) -> None:
        self._spec: spec_pb2.NodeSpec | None = None
        self._paths: dict[str, list[str]] = {}
        self._numbers: list[int] = []

    def _for(self, spec: spec_pb2.NodeSpec) -> None:
        if self._spec is not spec:
            self._spec, self._paths, self._numbers = spec, {}, unknown_numbers(spec)

    def paths(self, spec: spec_pb2.NodeSpec, section: str) -> list[str]:
        self._for(spec)
        found = self._paths.get(section)
        if found is None:
            found = self._paths[section] = unknown_paths(getattr(spec, section))
        return found

    def numbers(self, spec: spec_pb2.NodeSpec) -> list[int]:
        self._for(spec)
        return self._numbers


async def converge_section(
    spec: spec_pb2.NodeSpec,
    section: str,
    generation: int,
    converger: Converger | None,
    memo: UnknownFieldsMemo | None = None,
) -> SectionResult:
    """One section's result: its converger's (errors become retryable), or the no-converger rule."""
    desired: Message = getattr(spec, section)
    unknown = memo.paths(spec, section) if memo is not None else unknown_paths(desired)
    if unknown:
        number = field_number(section)
        return SectionResult(
            UNSUPPORTED,
            reason=REASON_UNKNOWN_FIELDS,
            message=f"section {section} (NodeSpec field {number}) has fields this agent does not know: "
            + ", ".join(f"{number}.{p}" for p in unknown),
            terminal=True,
        )
    if converger is None:
        if section_is_empty(spec, section):
            return SectionResult(CONVERGED)
        return SectionResult(
            UNSUPPORTED,
            reason=REASON_UNSUPPORTED,
            message=f"no converger for section {section} (NodeSpec field {field_number(section)})",
            terminal=True,
        )
    try:
        # Called even when the section is empty: an empty devices section must release every hold.
        return await converger.converge(desired, generation)
    except Exception as e:
        log.warning("event=converge.error section=%s generation=%d error=%r", section, generation, str(e))
        return SectionResult(PROGRESSING, reason=REASON_CONVERGER_ERROR, message=f"{type(e).__name__}: {e}")


async def run(
    spec: spec_pb2.NodeSpec,
    generation: int,
    convergers: Mapping[str, Converger],
    memo: UnknownFieldsMemo | None = None,
) -> RunOutcome:
    """One pass over every section in `SECTIONS` order (`memo`: the agent's, kept across its passes)."""
    results: list[SectionResult] = []
    statuses: list[common_pb2.SectionStatus] = []
    events: list[session_pb2.AllocationReport] = []
    durations: dict[str, float] = {}
    loop = asyncio.get_running_loop()
    for section in SECTIONS:
        started = loop.time()
        result = await converge_section(spec, section, generation, convergers.get(section), memo)
        durations[section] = loop.time() - started
        results.append(result)
        events.extend(result.events)
        statuses.append(
            common_pb2.SectionStatus(
                section=section,
                state=result.reported_state,
                generation=generation,
                reason=result.reason,
                message=result.message,
            )
        )
    for number in memo.numbers(spec) if memo is not None else unknown_numbers(spec):
        result = SectionResult(
            UNSUPPORTED,
            reason=REASON_UNKNOWN_FIELDS,
            message=f"NodeSpec field {number} is a section this agent does not know",
            terminal=True,
        )
        results.append(result)
        statuses.append(
            common_pb2.SectionStatus(
                section=f"field-{number}",
                state=result.reported_state,
                generation=generation,
                reason=result.reason,
                message=result.message,
            )
        )
    return RunOutcome(statuses=statuses, events=events, observed=is_settled(results), durations=durations)
