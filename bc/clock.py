"""Injected time: no logic reads the world's clock directly.

`Clock.now()` is wall time in seconds (float), `monotonic()` never goes back,
`sleep()` waits. The simulator and tests substitute `bc.testing.FakeClock`;
the control plane asks the store (`Store.now()`) for business time.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float: ...

    def monotonic(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...


class SystemClock:
    def now(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


def ms(seconds: float) -> int:
    """Seconds (float) to whole milliseconds, the unit on the wire and in the store."""
    return round(seconds * 1000)
