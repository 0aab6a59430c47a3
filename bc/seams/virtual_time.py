"""A virtual-time asyncio event loop: time jumps to the next timer only when nothing can run.

Theory of operation. asyncio's loop runs one iteration at a time: it runs the
callbacks that are ready, then asks its selector for I/O with a timeout that
is 0 when more callbacks are ready and otherwise the time until the next timer
(None when there is none). `VirtualTimeLoop` keeps its own `time()` and
replaces only that question to the selector:

* it always polls real I/O with a zero timeout first: a socket, a pipe or
  the loop's self-pipe that is ready is handled at once, and time stands;
* asked for 0 (callbacks are ready), it returns what the poll found: time
  never moves while work is ready;
* asked for a positive timeout with nothing ready, every task is waiting, so
  it sets `time()` to the next timer's deadline and returns; asyncio then runs
  that timer as due. No wall time passes: an hour of `asyncio.sleep` takes
  microseconds;
* asked for None (no timer at all), or while a job it handed to an executor
  (`run_in_executor`, `asyncio.to_thread`, `getaddrinfo`) is still running or
  closing joins the executor's threads, only the outside world can wake the
  loop, so it waits for real I/O with no timeout, and time stands meanwhile:
  an executor job takes no virtual time;
* while a driver awaits a socket inside `bc.runtime.aio.outside_world()` (the
  PostgreSQL store), the reply is real I/O the loop will see, and no timer
  may jump past it: the loop waits for that I/O for real, as long as the
  time to the next timer. Time stands if the I/O comes first (nearly always:
  a reply takes milliseconds). If it does not, the timer falls due once that
  much real time has passed. psycopg needs this: it re-checks a connection
  on a timer of its own (its reply may already sit in libpq's buffer, with
  nothing left on the socket), and a server-side lock wait must let a test's
  `asyncio.timeout` fire rather than hang the loop.

So `asyncio.sleep`, `asyncio.timeout`, `wait_for`, `call_later` and
`bc.seams.clock.LoopClock` all agree on one time, and the same program on the same
start makes the same timeline, whatever the host's load.

Warning: anything that completes in a thread the loop did not start itself
(aiosqlite's worker thread, grpc.aio's completion queue, a subprocess watcher)
must not be awaited on this loop while a timer is pending: the loop cannot
see that work and jumps to the timer before it finishes, so a 5 s timeout
around a grpc call fires at once. Tests on the virtual loop use the inline
SQLite store and in-memory links (`bc.seams.network`); tests over real
gRPC run on the ordinary loop and the wall clock.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import math
import selectors
import weakref
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar, TypeVarTuple, Unpack

from bc.seams.clock import LoopClock

T = TypeVar("T")
Ts = TypeVarTuple("Ts")

START = 1000.0
"""Where a virtual loop's `time()` starts (not 0: a zero monotonic time reads like "never" to some code)."""

WALL_START = 1_800_000_000.0
"""The wall time (`LoopClock.now()`) at a virtual loop's start: 2027-01-15, far from any real run's clock."""

_Poll = Callable[[float | None], list[tuple[selectors.SelectorKey, int]]]


class _JumpingSelector(selectors.DefaultSelector):
    """The platform's selector, asking its `VirtualTimeLoop` what to do when nothing is ready.

    It holds the loop weakly: a loop <-> selector cycle would leave every closed
    loop to the garbage collector, whose finalizers then run at random moments.
    """

    def __init__(self, loop: VirtualTimeLoop) -> None:
        super().__init__()
        self._loop = weakref.ref(loop)

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = super().select(0)
        loop = self._loop()
        if ready or timeout == 0 or loop is None:
            return ready
        return loop._on_idle(timeout, super().select)


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An event loop whose `time()` is virtual: see the module docstring.

    `start` is the loop's first `time()`; `wall` is the wall time then, which a
    `LoopClock()` made without a wall offset reads on this loop (`now()` =
    `time()` + `wall_offset`), so production code that builds its own clock
    stays deterministic here too.
    """

    def __init__(self, start: float = START, wall: float = WALL_START) -> None:
        self._virtual_now = start
        self.wall_offset = wall - start
        self._executor_jobs: set[asyncio.Future[Any]] = set()
        self._outside_holds = 0
        super().__init__(selector=_JumpingSelector(self))

    def time(self) -> float:
        return self._virtual_now

    def run_in_executor(
        self, executor: concurrent.futures.Executor | None, func: Callable[[Unpack[Ts]], T], *args: *Ts
    ) -> asyncio.Future[T]:
        # Remember the job so the loop waits for it for real instead of jumping past it.
        fut = super().run_in_executor(executor, func, *args)
        self._executor_jobs.add(fut)
        fut.add_done_callback(self._executor_jobs.discard)
        return fut

    async def shutdown_default_executor(self, *args: Any) -> None:
        # Closing joins the executor's threads from another thread: no timer may fire meanwhile.
        joining: asyncio.Future[None] = self.create_future()
        self._executor_jobs.add(joining)
        try:
            await super().shutdown_default_executor(*args)
        finally:
            self._executor_jobs.discard(joining)
            joining.cancel()

    def hold_time(self, delta: int) -> None:
        """`bc.runtime.aio.outside_world()`: while any await on the outside world (a database socket) is open, time
        moves no faster than real time (see the module docstring)."""
        self._outside_holds += delta

    def _on_idle(self, timeout: float | None, poll: _Poll) -> list[tuple[selectors.SelectorKey, int]]:
        # asyncio asks for a positive timeout only when no callback is ready, and it has already dropped
        # cancelled timers from the head of its heap, so `_scheduled[0]` is the deadline it computed.
        scheduled: list[asyncio.TimerHandle] = self._scheduled  # type: ignore[attr-defined]
        nxt = scheduled[0].when() if scheduled else math.inf
        if timeout is None or self._executor_jobs or math.isinf(nxt):
            return poll(None)  # only the outside world can wake the loop: wait for it, time stands
        if self._outside_holds:
            ready = poll(timeout)  # the time to the next timer, waited for real
            if ready:
                return ready  # the outside world answered first: time stands
        if timeout < asyncio.base_events.MAXIMUM_SELECT_TIMEOUT:  # type: ignore[attr-defined]
            self._virtual_now = max(self._virtual_now, nxt)  # land exactly on the deadline, no float drift
        else:
            self._virtual_now += timeout  # asyncio caps one wait at a day; the next pass goes on
        return []


def run(coro: Coroutine[Any, Any, T], *, start: float = START, wall: float = WALL_START) -> T:
    """Run `coro` to completion on a fresh virtual loop, like `asyncio.run`."""
    with asyncio.Runner(loop_factory=lambda: VirtualTimeLoop(start, wall)) as runner:
        return runner.run(coro)


async def advance(seconds: float) -> None:
    """Let `seconds` of loop time pass: every task runs what falls due meanwhile (on the virtual loop, at once)."""
    await asyncio.sleep(seconds)


def virtual_clock(now: float = WALL_START, *, start: float = START) -> LoopClock:
    """A clock that reads `now` at this instant and then moves with the running loop.

    Outside a running loop it stands at `start` (a virtual loop's first
    `time()`), so a synchronous fixture that makes certificates and the test
    that then runs on a fresh virtual loop see one instant.
    """
    clock = LoopClock(wall_offset=0.0, start=start)
    clock.wall_offset = now - clock.monotonic()
    return clock
