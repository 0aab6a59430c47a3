"""How many new sessions a gateway takes on at once: the reference's reconnect-storm limits, pure.

When a gateway dies, or the network heals, thousands of nodes redial together. A gateway admits
new streams through a token bucket (`HANDSHAKES_PER_S`, with as large a burst) and runs at most
`MAX_PENDING_HELLOS` Hello transactions at a time; beyond either it answers RESOURCE_EXHAUSTED
at once, and the node retries after its full-jitter back-off (`agent.session.dialing`), which
spreads the storm out instead of queueing it in the store.

Status reports have a budget too, per gateway (`StatusBudget`, `STATUS_WRITES_PER_S`): a session whose
write would exceed it waits its turn, and since status is latest-wins it then writes the newest report
it holds, so a burst of reports costs the store at most the budget, never a queue.
"""

from __future__ import annotations

from dataclasses import dataclass

HANDSHAKES_PER_S = 200.0
MAX_PENDING_HELLOS = 64
STATUS_WRITES_PER_S = 1000.0


@dataclass
class Admission:
    refilled_at: float
    rate: float = HANDSHAKES_PER_S
    burst: float = HANDSHAKES_PER_S
    max_pending: int = MAX_PENDING_HELLOS
    tokens: float = HANDSHAKES_PER_S
    pending: int = 0
    refused: int = 0

    def handshake(self, now: float) -> bool:
        """A new stream; False when the bucket is empty (refuse it)."""
        self.tokens = min(self.burst, self.tokens + (now - self.refilled_at) * self.rate)
        self.refilled_at = now
        if self.tokens < 1.0:
            self.refused += 1
            return False
        self.tokens -= 1.0
        return True

    def hello_started(self) -> bool:
        """A Hello transaction about to run; False when `max_pending` already run (refuse it)."""
        if self.pending >= self.max_pending:
            self.refused += 1
            return False
        self.pending += 1
        return True

    def hello_done(self) -> None:
        self.pending = max(0, self.pending - 1)


@dataclass
class StatusBudget:
    """A token bucket that hands out turns: `turn(now)` reserves the next write slot and says how long to wait."""

    refilled_at: float
    rate: float = STATUS_WRITES_PER_S
    burst: float = STATUS_WRITES_PER_S
    tokens: float = STATUS_WRITES_PER_S
    waited: int = 0

    def turn(self, now: float) -> float:
        self.tokens = min(self.burst, self.tokens + (now - self.refilled_at) * self.rate)
        self.refilled_at = now
        self.tokens -= 1.0  # reserved now; a negative balance is the queue ahead of this write
        if self.tokens >= 0:
            return 0.0
        self.waited += 1
        return -self.tokens / self.rate
