"""ClockSkew: this process's clock against the store's (reference: failure modes, "Clock skew").

Business time is the store's (`Store.now()`, the reference's
`compute_now()`), so a control-plane process whose own clock is off decides
nothing wrong by it; but its logs, its timeouts and whatever it hands out
with a local timestamp drift, and an operator should hear of it. More than
a second off raises ClockSkew: one warning log line when the process goes
into skew (`event=clock.skew offset_ms=…`), one info line when it recovers,
and a `bc doctor` finding.

On the embedded SQLite store the two clocks are the same clock and the
offset is zero; on PostgreSQL they are two hosts' clocks. The store's time
is compared with the midpoint of the local readings around the call, so a
slow round trip does not look like skew.
"""

from __future__ import annotations

import logging

from bc.seams.clock import Clock
from bc.store import Store, StoreError

log = logging.getLogger("bc.control.doctor.clock_skew")

THRESHOLD_S = 1.0
INTERVAL_S = 10.0


class ClockSkewMonitor:
    def __init__(self, store: Store, clock: Clock, threshold_s: float = THRESHOLD_S) -> None:
        self.store = store
        self.clock = clock
        self.threshold_ms = round(threshold_s * 1000)
        self.offset_ms: int | None = None  # store minus this process; None until the first sample
        self.skewed = False

    async def sample(self) -> int:
        """Measure the offset once and log a transition into or out of skew; returns the offset in ms."""
        before = self.clock.now()
        store_now = await self.store.now()
        after = self.clock.now()
        offset_ms = round((store_now - (before + after) / 2) * 1000)
        self.offset_ms = offset_ms
        skewed = abs(offset_ms) > self.threshold_ms
        if skewed and not self.skewed:
            log.warning(
                "event=clock.skew offset_ms=%d threshold_ms=%d store=%s",
                offset_ms,
                self.threshold_ms,
                self.store.description,
            )
        elif self.skewed and not skewed:
            log.info("event=clock.skew_recovered offset_ms=%d", offset_ms)
        self.skewed = skewed
        return offset_ms

    async def run(self, interval_s: float = INTERVAL_S) -> None:
        while True:
            try:
                await self.sample()
            except StoreError as e:
                # The loops that write report an unreachable store; a missed sample is only a missed sample.
                log.debug("event=clock.sample_failed error=%s", e)
            await self.clock.sleep(interval_s)
