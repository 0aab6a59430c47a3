"""A start step that reaches the store is retried until the store answers: a process started in an outage waits.

A control-plane process starting while its store is away (PostgreSQL failing over, the simulator's store
outage) used to die at its first store call (`intent.register`, the gateway's first lease renewal); under
systemd it was restarted blind, in the harness and `bc sim` the run ended. `retry_start` runs one start
step again after the supervisor's back-off (`bc.assembly.supervisor.backoff_s`: full jitter, 1 s doubling
to 30 s, the injected clock and Random, so a seeded run retries at the same instants), logging each failed
attempt with why, until it succeeds. Only `StoreError` is retried: a refusal (another process holds the
gateway's lease, a key that does not match) is an answer, not an outage, and ends the start as before.

A step must be safe to run again after it raised: a transaction that failed rolled back, and nothing it
did before the failure may need undoing (the store's own `open` is not such a step: docs/design.md).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Awaitable, Callable
from typing import TypeVar

from bc.assembly.supervisor import backoff_s
from bc.protocol.text_safety import one_line
from bc.seams.clock import Clock
from bc.store import StoreError

log = logging.getLogger("bc.assembly.retry")

T = TypeVar("T")


async def retry_start(
    step: Callable[[], Awaitable[T]],
    *,
    what: str,
    clock: Clock,
    rng: random.Random,
    process: str = "",
    retry_on: tuple[type[BaseException], ...] = (StoreError,),
) -> T:
    """`await step()`, again after a back-off each time it raises one of `retry_on`, until it returns."""
    failures = 0
    while True:
        try:
            result = await step()
        except retry_on as e:
            failures += 1
            wait = backoff_s(failures, rng)
            log.warning(
                "event=start.retrying process=%s step=%s attempt=%d in_s=%.1f error=%s",
                process,
                what,
                failures,
                wait,
                one_line(f"{type(e).__name__}: {e}")[:300],
            )
            await clock.sleep(wait)
            continue
        if failures:
            log.info("event=start.recovered process=%s step=%s attempts=%d", process, what, failures + 1)
        return result


__all__ = ["retry_start"]
