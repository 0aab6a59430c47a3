"""The short trace of a failed invariant: the last events of the store's log that touched what it names.

A counterexample's sentence names the facts behind it; the trace shows how the fleet got there, from the same
events log the digest is taken over: the last `LAST` events up to the violation (and a little after, for what
the checker saw settle) whose subject is one of its entities or whose data names one. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from bc.protocol.text_safety import one_line

LAST = 8
AFTER_MS = 1_000
"""Events this long after the violation still count (what made it visible to the checker)."""

Event = tuple[int, str, str, str, int]
"""A row of the events log: seq, type, subject, data (JSON), at_ms."""


def _at(at_ms: int) -> str:
    return datetime.fromtimestamp(at_ms / 1000, UTC).strftime("%H:%M:%S.%f")[:-3]


def trace(events: Sequence[Event], entities: Sequence[str], at_ms: int | None, last: int = LAST) -> list[str]:
    """One line per event (`HH:MM:SS.mmm type subject data`), oldest first; empty when nothing is named."""
    if not entities:
        return []
    until = None if at_ms is None else at_ms + AFTER_MS
    touched = [
        e for e in events if (until is None or e[4] <= until) and (e[2] in entities or any(x in e[3] for x in entities))
    ]
    return [one_line(f"{_at(at)} {kind} {subject} {data}")[:200] for _, kind, subject, data, at in touched[-last:]]


__all__ = ["LAST", "trace"]
