"""When a gateway must stop routing: the pure rule over its lease's renewals (reference: "Gateway cut off").

A gateway holds the lease `gateway:<id>` (20 s TTL, renewed every 5 s). It fences itself, that is
forgets the lease, closes every stream `UNAVAILABLE` and refuses new sessions, when

* a renewal finds another owner (the lease moved: another process routes these nodes now), or
* no renewal has succeeded for `FENCE_AFTER_S` (10 s, half the TTL): the store may already think the
  lease expired, and a node this gateway still routes may be opening a session elsewhere.

It routes again after its next successful renewal. The rule reads only the monotonic times it is
given, so it is tested alone and the simulator drives it on virtual time.
"""

from __future__ import annotations

from dataclasses import dataclass

FENCE_AFTER_S = 10.0
MIN_CHECK_S = 0.01
"""The lease loop never sleeps less than this: a sleep shorter than the clock's resolution at `now` would not
move the clock at all (a float's last bit), so a loop waking "just before the deadline" would wake again at the
same instant forever (found by `bc sim --chaos storm`, on virtual time, where nothing else moves the clock)."""


@dataclass
class LeaseFence:
    last_renewed: float
    fenced: bool = False
    why: str = ""
    final: bool = False  # raised for good (`end`): another process took the lease after this one (bc.gateway.lease)

    def end(self, why: str) -> None:
        """Fence for good: no renewal lifts it."""
        self._raise(why)
        self.final = True

    def renewed(self, now: float) -> bool:
        """A renewal succeeded; True when this lifts a fence."""
        if self.final:
            return False
        self.last_renewed = now
        lifted = self.fenced
        self.fenced, self.why = False, ""
        return lifted

    def moved(self, now: float) -> bool:
        """A renewal found another owner; True when this raises the fence."""
        return self._raise("the lease moved to another gateway")

    def failed(self, now: float) -> bool:
        """A renewal could not reach the store; True when this raises the fence (time ran out)."""
        return self.check(now)

    def check(self, now: float) -> bool:
        """Time passing without a renewal; True when this raises the fence."""
        if now >= self.last_renewed + FENCE_AFTER_S:
            return self._raise(f"no lease renewal for {now - self.last_renewed:.0f} s")
        return False

    def next_check_in(self, now: float, renew_every: float) -> float:
        """How long the lease loop may sleep: the next renewal, or sooner the moment the fence would rise."""
        if self.fenced:
            return min(renew_every, 1.0)
        return max(MIN_CHECK_S, min(renew_every, self.last_renewed + FENCE_AFTER_S - now))

    def _raise(self, why: str) -> bool:
        raised = not self.fenced
        self.fenced, self.why = True, why
        return raised
