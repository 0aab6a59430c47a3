"""How many new sessions a gateway takes on at once: the reference's reconnect-storm limits, pure.

When a gateway dies, or the network heals, thousands of nodes redial together. A gateway admits
new streams through a token bucket (`HANDSHAKES_PER_S`, with as large a burst) and runs at most
`MAX_PENDING_HELLOS` Hello transactions at a time.

A Hello beyond that bound waits for a slot, first come first served, while the wait is short: the
queue of waiting Hellos is bounded by the time it takes to drain (`MAX_HELLO_WAIT_S` at the rate this
gateway measured itself finishing Hellos while it was saturated, `hello_rate`, counting the running
Hellos ahead of it too) and by a count (`MAX_WAITING_HELLOS`), and a Hello that waited
`HELLO_WAIT_LIMIT_S` gives up. A wait costs the node nothing but the wait; a refusal costs it a new
TLS handshake and a redial, and the gateway the same handshake again, and it comes back no sooner
than it would have been served. The store never sees more than `MAX_PENDING_HELLOS` transactions: the queue is
in the gateway's memory.

Beyond the bucket or the queue the stream is refused RESOURCE_EXHAUSTED with a retry-after
(`retry_after`, carried as `bc-retry-after-ms` in the status's trailing metadata): the refused nodes
are given consecutive slots, one per Hello the gateway can finish, starting when what it already
holds has drained, each jittered within its slot. So they come back at the rate the gateway can take
them, not on a doubling back-off that leaves the last of them waiting seconds after the gateway has
room. The agent honours it (up to `RETRY_AFTER_MAX_S`) without doubling its back-off
(`agent.session.dialing`).

Status reports have a budget too, per gateway (`StatusBudget`, `STATUS_WRITES_PER_S`): a session whose
write would exceed it waits its turn, and since status is latest-wins it then writes the newest report
it holds, so a burst of reports costs the store at most the budget, never a queue.
"""

from __future__ import annotations

import enum
import random
from dataclasses import dataclass

HANDSHAKES_PER_S = 200.0
MAX_PENDING_HELLOS = 64
STATUS_WRITES_PER_S = 1000.0

MAX_HELLO_WAIT_S = 8.0
"""A Hello waits for a slot only if the Hellos ahead of it (running and waiting) should be done within this long:
inside the node's 15 s wait for its Welcome, with room for the estimate to be wrong. A refused node would come
back no sooner (its retry-after is when the same Hellos are done) and cost the gateway another TLS handshake."""
HELLO_WAIT_LIMIT_S = 8.0
"""A waiting Hello gives up after this long (the rate was overestimated) and is refused with a retry-after."""
MAX_WAITING_HELLOS = 1024
"""Waiting Hellos, at most, whatever the measured rate."""
HELLO_RATE_PRIOR = 100.0
"""Hellos a second a gateway assumes it finishes at the start of a storm, until it has measured itself saturated."""
HELLO_RATE_WEIGHT = 0.1
"""The weight of one inter-completion gap in the measured rate (an exponential moving average)."""
RETRY_AFTER_MAX_S = 60.0
"""The longest retry-after a gateway names (and the longest an agent honours): the agent's back-off cap."""


class Turn(enum.Enum):
    RUN = "run"  # a slot is free: run the Hello transaction now
    WAIT = "wait"  # queued: a finishing Hello's slot is handed over (`hello_done`, then `take_waiting`)
    REFUSE = "refuse"  # the queue is full: refuse it, with `retry_after`


@dataclass
class Admission:
    refilled_at: float
    rate: float = HANDSHAKES_PER_S
    burst: float = HANDSHAKES_PER_S
    max_pending: int = MAX_PENDING_HELLOS
    tokens: float = HANDSHAKES_PER_S
    pending: int = 0
    refused: int = 0
    max_wait_s: float = MAX_HELLO_WAIT_S
    max_run_s: float = MAX_HELLO_WAIT_S
    max_waiting: int = MAX_WAITING_HELLOS
    waiting: int = 0
    waited: int = 0
    hello_gap_s: float = 1.0 / HELLO_RATE_PRIOR
    """The mean time between two Hellos finishing while the gateway was saturated: 1 / its Hello rate."""
    last_done: float | None = None
    retry_horizon: float = 0.0
    """The end of the last slot handed to a refused stream: the next refusal's slot starts no earlier."""

    @property
    def hello_rate(self) -> float:
        return 1.0 / self.hello_gap_s

    @property
    def run_limit(self) -> int:
        """Hellos that may run at once: `max_pending`, and no more than this gateway finishes within `max_run_s`
        at its measured rate.

        The running Hellos queue too, on the store's write lock (one write transaction at a time per process):
        64 of them at 5 a second (a loaded machine, 10,000 nodes) is a 13 s wait before the last one's
        transaction starts, past the node's wait for its Welcome. The node gave up, redialed and sent its Hello
        again, and the gateway ran the transaction of a session nobody was waiting for: at 10,000 nodes almost
        half the sessions opened were such. Little's law bounds the running Hellos as it bounds the waiting."""
        return max(1, min(self.max_pending, int(self.max_run_s / self.hello_gap_s)))

    def handshake(self, now: float) -> bool:
        """A new stream; False when the bucket is empty (refuse it)."""
        self._refill(now)
        if self.tokens < 1.0:
            self.refused += 1
            return False
        self.tokens -= 1.0
        return True

    def _refill(self, now: float) -> None:
        self.tokens = min(self.burst, self.tokens + max(0.0, now - self.refilled_at) * self.rate)
        self.refilled_at = max(self.refilled_at, now)

    def hello(self, now: float) -> Turn:
        """A Hello transaction about to run: now, after the ones waiting, or refused."""
        if self.pending < self.run_limit and not self.waiting:
            self.pending += 1
            return Turn.RUN
        # Queued only if everything ahead of it (the running Hellos, then the waiting ones) should be done in time.
        ahead = self.pending + self.waiting
        if self.waiting < self.max_waiting and (ahead + 1) * self.hello_gap_s <= self.max_wait_s:
            self.waiting += 1
            self.waited += 1
            return Turn.WAIT
        self.refused += 1
        return Turn.REFUSE

    def hello_done(self, now: float) -> None:
        """A Hello transaction ended; its slot is free (`take_waiting` hands it to the first waiting Hello)."""
        if self.pending >= self.run_limit or self.waiting > 0:  # saturated: the gap measures this gateway
            if self.last_done is not None:
                gap = max(0.0, now - self.last_done)
                self.hello_gap_s = max(1e-4, self.hello_gap_s + HELLO_RATE_WEIGHT * (gap - self.hello_gap_s))
            self.last_done = now
        else:
            # Not saturated: the next gap would measure the arrivals, not this gateway. And the next storm starts
            # from the optimistic prior, not from what the last one measured (minutes ago, maybe under other
            # load): a Hello queued on too hopeful an estimate costs a wait (bounded), a Hello refused on too
            # gloomy one a retry-after of many seconds while the gateway has room.
            self.last_done = None
            self.hello_gap_s = min(self.hello_gap_s, 1.0 / HELLO_RATE_PRIOR)
        self.pending = max(0, self.pending - 1)

    def take_waiting(self) -> bool:
        """Whether the first waiting Hello takes a free slot now (it leaves the queue and runs)."""
        if self.waiting > 0 and self.pending < self.run_limit:
            self.waiting -= 1
            self.pending += 1
            return True
        return False

    def hello_gave_up(self) -> None:
        """A waiting Hello left the queue without a slot (its stream ended, or it waited too long)."""
        self.waiting = max(0, self.waiting - 1)

    def retry_after(self, now: float, rng: random.Random) -> float:
        """Seconds a refused stream should wait before it dials again.

        The refused streams get consecutive slots, one per Hello this gateway can finish (the slower of the
        handshake rate and the Hello rate), starting once the Hellos it holds (running and waiting) and the
        handshakes it owes the bucket are done; each comes back at a uniform point of its own slot. Capped at
        `RETRY_AFTER_MAX_S` (beyond it, spread over the cap's second half).
        """
        self._refill(now)
        slot = max(1.0 / self.rate, self.hello_gap_s)
        drained = now + max((self.pending + self.waiting) * self.hello_gap_s, (1.0 - self.tokens) / self.rate)
        start = max(drained, self.retry_horizon)
        self.retry_horizon = start + slot
        delay = start - now + rng.uniform(0.0, slot)
        if delay > RETRY_AFTER_MAX_S:
            return rng.uniform(RETRY_AFTER_MAX_S / 2, RETRY_AFTER_MAX_S)
        return delay


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
