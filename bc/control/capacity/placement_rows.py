"""The placement pass's queue, read from stored rows it can trust (issue 29).

`reserve` checks a request against the limits table before it stores it, but a row may still be out of
bounds: written by an older server that checked less, by a script straight into the database, or by hand.
One such row used to make every pass raise (`--duration 106751991167d`: its end does not fit an int64, so
booking it raised OverflowError), and with it no reservation could be placed fleet-wide.

So the pass reads its queue through `admit`: each pending row is checked against the same bounds
(`bc.protocol.limits`) and converted; a row out of them, or one that does not convert (a selector that is
not JSON, a device class we do not know), is *set aside*, with the sentence saying why, and the rest of the
queue goes on. The pass fails a set-aside row with the reason `set-aside: …` and publishes
`reservation.set-aside` naming it. Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from bc.control.capacity.placement_plan import BINDINGS, Request
from bc.protocol.atoms import DEVICE_CLASSES
from bc.protocol.limits import LIMITS, Limits
from bc.store import Row

SET_ASIDE = "set-aside"
"""The reason's prefix, and the suffix of the event (`reservation.set-aside`) that names the row."""


@dataclass(frozen=True)
class SetAside:
    reservation_id: str
    problem: str  # one sentence: which field, its value, the bound


def _int_or_none(row: Row, key: str) -> int | None:
    v = row[key]
    return None if v is None else int(v)


MAX_INSTANT_MS = 1 << 47
"""The latest `created_at_ms` a row may carry (the year 6429): far past any clock, far inside an int64."""


def row_problem(row: Row, limits: Limits = LIMITS) -> str | None:
    """Why the pass must not plan this pending row, as a sentence; None when it is within every bound.

    Bounds on instants are relative to the row's own `created_at_ms`, as `reserve` checked them then, so
    the answer does not depend on when the pass runs."""

    def outside(what: str, value: int | None, low: int, high: int) -> str | None:
        if value is None or low <= value <= high:
            return None
        return f"{what} {value:,} is outside {low:,}..{high:,}"

    try:
        start, end, duration = (_int_or_none(row, k) for k in ("start_ms", "end_ms", "duration_ms"))
        created = int(row["created_at_ms"])
        latest_start = max(0, min(created, MAX_INSTANT_MS)) + limits.max_start_ahead_ms
        checks = (
            outside("created_at_ms", created, 0, MAX_INSTANT_MS),
            outside("gpus", int(row["gpus"]), 1, limits.max_gpus),
            outside("cpus", int(row["cpus"] or 0), 0, limits.max_cpus),
            outside("memory_bytes", int(row["memory_bytes"] or 0), 0, limits.max_memory_bytes),
            outside("hugepages_1g", int(row["hugepages_1g"] or 0), 0, limits.max_hugepages_1g),
            outside("duration_ms", duration, 1, limits.max_duration_ms),
            outside("start_ms", start, 0, latest_start),
            outside("end_ms", end, 1, latest_start + limits.max_duration_ms),
        )
    except (TypeError, ValueError, IndexError, KeyError) as e:
        return f"a field is not a number ({e})"
    for problem in checks:
        if problem is not None:
            return problem
    if str(row["device_class"]) not in DEVICE_CLASSES:
        return f"device_class {str(row['device_class'])[:64]!r} is unknown"
    if str(row["binding"]) not in BINDINGS:
        return f"binding {str(row['binding'])[:64]!r} is unknown"
    return None


def admit(
    rows: Iterable[Row], convert: Callable[[Row], Request], limits: Limits = LIMITS
) -> tuple[list[Request], list[SetAside]]:
    """The queue the planner may see, in the rows' order, and the rows set aside (each with its sentence)."""
    queue: list[Request] = []
    aside: list[SetAside] = []
    for row in rows:
        rid = str(row["id"])
        problem = row_problem(row, limits)
        if problem is None:
            try:
                queue.append(convert(row))
                continue
            except (TypeError, ValueError, KeyError, AttributeError, RecursionError) as e:
                # json.JSONDecodeError is a ValueError: a selector or avoid list that is not JSON.
                problem = f"the row does not convert ({type(e).__name__}: {str(e)[:200]})"
        aside.append(SetAside(rid, problem))
    return queue, aside


__all__ = ["MAX_INSTANT_MS", "SET_ASIDE", "SetAside", "admit", "row_problem"]
