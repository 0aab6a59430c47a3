"""The condition set and each condition's age, on the agent's monotonic clock.

`update` takes the whole set a health pass arrived at and returns what
changed (a new condition, or a new status or reason; a new message alone is
no change). A condition's `since` moves only on a change, so its age says how
long it has stood. Conditions leave with what they describe (a GPU gone from
the inventory). Reports carry ages, never timestamps (the reference's rule):
the control plane derives `since` from its own clock.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from agent.health.rules import Verdict
from bc.protocol.pb import common_pb2


@dataclass(frozen=True)
class Change:
    type: str
    before: Verdict | None
    after: Verdict | None


class ConditionBook:
    def __init__(self) -> None:
        self._held: dict[str, tuple[Verdict, float]] = {}

    def update(self, verdicts: Iterable[Verdict], now: float) -> list[Change]:
        changes: list[Change] = []
        seen: dict[str, tuple[Verdict, float]] = {}
        for v in verdicts:
            held = self._held.get(v.type)
            if held is None or (held[0].status, held[0].reason) != (v.status, v.reason):
                changes.append(Change(v.type, held[0] if held else None, v))
                seen[v.type] = (v, now)
            else:
                seen[v.type] = (v, held[1])
        changes.extend(Change(t, held[0], None) for t, held in self._held.items() if t not in seen)
        self._held = seen
        return changes

    def get(self, condition_type: str) -> Verdict | None:
        held = self._held.get(condition_type)
        return held[0] if held else None

    def verdicts(self) -> list[Verdict]:
        return [v for v, _ in self._held.values()]

    def report(self, now: float) -> list[common_pb2.Condition]:
        return [
            common_pb2.Condition(
                type=v.type,
                status=v.status,
                reason=v.reason,
                message=v.message,
                age_ms=max(0, round((now - since) * 1000)),
            )
            for v, since in sorted(self._held.values(), key=lambda h: h[0].type)
        ]
