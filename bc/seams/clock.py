"""Injected time: the running event loop's time is the only clock.

`Clock.now()` is wall time in seconds (float), `monotonic()` never goes back,
`sleep()` waits. `LoopClock` reads the running loop's `time()` for
`monotonic()` and adds a wall offset for `now()`, so a clock reading, an
`asyncio.sleep`, a `wait_for` and every `call_later` agree: on the ordinary
loop that is the host's clock, on `bc.seams.virtual_time.VirtualTimeLoop` (tests,
the simulator) it is virtual time, which jumps to the next timer when every
task waits. Nothing else moves time. The control plane asks the store
(`Store.now()`) for business time.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float: ...

    def monotonic(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...


class LoopClock:
    """`monotonic()` is the running loop's `time()`; `now()` adds a wall offset.

    `wall_offset=None` (production, `SystemClock()`): the loop's own offset if it
    declares one (a virtual loop does: `wall_offset`), else the host's wall clock.
    On the ordinary loop `time()` is `time.monotonic()`, so loop time plus the
    host's offset is `time.time()`, read directly so that an NTP step or a
    suspend is followed: certificates and tokens must carry the true date.

    `wall_offset=X` (tests, the simulator): `now()` is `monotonic() + X`, the same
    every run; `step()` moves it, as an NTP step moves a host's clock, and
    `shifted()` makes another host's clock, set off from this one.

    In a thread without a loop (`asyncio.to_thread`), the clock reads the loop
    it last read on, while that loop is open: a worker thread sees its loop's
    time, virtual or not. With no such loop, `monotonic()` reads `start` if
    given (a virtual loop's start, so synchronous set-up sees the instant the
    loop starts at), else `time.monotonic()`, what the ordinary loop reads.
    """

    def __init__(self, wall_offset: float | None = None, *, start: float | None = None) -> None:
        self.wall_offset = wall_offset
        self.start = start
        self._last_loop: weakref.ref[asyncio.AbstractEventLoop] | None = None

    def _loop(self) -> asyncio.AbstractEventLoop | None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            last = self._last_loop() if self._last_loop is not None else None
            return last if last is not None and not last.is_closed() else None
        if self._last_loop is None or self._last_loop() is not loop:
            self._last_loop = weakref.ref(loop)  # weak: a clock must not keep a finished test's loop alive
        return loop

    def monotonic(self) -> float:
        loop = self._loop()
        if loop is not None:
            return loop.time()
        return time.monotonic() if self.start is None else self.start

    def now(self) -> float:
        if self.wall_offset is not None:
            return self.monotonic() + self.wall_offset
        loop = self._loop()
        loop_offset: float | None = getattr(loop, "wall_offset", None)
        if loop is None or loop_offset is None:
            return time.time()
        return loop.time() + loop_offset

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    def step(self, seconds: float) -> None:
        """Step this clock's wall time by `seconds` (monotonic time does not move)."""
        self.wall_offset = self._own_offset() + seconds

    def shifted(self, seconds: float) -> LoopClock:
        """Another host's clock on the same loop: its wall time `seconds` ahead of this one's (behind if negative)."""
        return LoopClock(self._own_offset() + seconds, start=self.start)

    def _own_offset(self) -> float:
        if self.wall_offset is None:
            raise RuntimeError("the host's wall clock is not ours to step or shift: make the clock with a wall_offset")
        return self.wall_offset


SystemClock = LoopClock
"""The production clock: `SystemClock()` is a `LoopClock` that follows the host's wall clock."""


def ms(seconds: float) -> int:
    """Seconds (float) to whole milliseconds, the unit on the wire and in the store."""
    return round(seconds * 1000)
