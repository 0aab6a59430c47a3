"""Small asyncio helpers shared by the agent and the server.

Their timeouts are the running loop's time, like every `Clock` (`bc.seams.clock`):
seconds of the host on the ordinary loop, virtual seconds on
`bc.seams.virtual_time.VirtualTimeLoop`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar, cast

log = logging.getLogger("bc.aio")

T = TypeVar("T")

RECANCEL_S = 1.0


async def wait_event(event: asyncio.Event, timeout: float) -> bool:  # noqa: ASYNC109 (a bounded wake-up)
    """Wait for `event` at most `timeout` seconds; True if it was set.

    Not `asyncio.wait_for`: on Python 3.11 it can swallow a cancellation that
    arrives as the inner wait completes, and a loop around it then never
    stops (seen as a `bc node` that ignored SIGTERM). `asyncio.timeout` keeps
    the cancellation.
    """
    try:
        async with asyncio.timeout(timeout):
            await event.wait()
    except TimeoutError:
        return False
    return True


async def cancel_and_wait(tasks: Iterable[asyncio.Task[object]]) -> None:
    """Cancel `tasks` and wait until every one has ended, as a process must before it exits.

    A task that outlives its cancel for `RECANCEL_S` is cancelled again, with a warning naming it: a
    library that drops a cancel (3.11's `wait_for`, CPython gh-86296) must cost a second, never a
    process that does not stop.
    """
    pending = set(tasks)
    for t in pending:
        t.cancel()
    while pending:
        _, pending = await asyncio.wait(pending, timeout=RECANCEL_S)
        for t in pending:
            log.warning("event=task.cancel-lost task=%s; cancelling it again", t.get_name())
            t.cancel()


@contextlib.contextmanager
def outside_world() -> Iterator[None]:
    """Mark an await on the outside world (a database socket) that the loop must wait for.

    On the virtual-time loop (`bc.seams.virtual_time`) time stands while any such
    await is open, as it does for an executor job: the reply is real I/O,
    and no timer may jump ahead of it. On the ordinary loop this costs a
    lookup and nothing else.
    """
    hold = getattr(asyncio.get_running_loop(), "hold_time", None)
    if hold is None:
        yield
        return
    hold(1)
    try:
        yield
    finally:
        hold(-1)


def answer(fut: asyncio.Future[T], *, result: T | None = None, exc: BaseException | None = None) -> None:
    """Settle `fut` with `exc` or else `result`, unless it is settled already (its waiter gave up)."""
    if fut.done():
        return
    if exc is not None:
        fut.set_exception(exc)
    else:
        fut.set_result(cast(T, result))


def retrieved(fut: asyncio.Future[Any]) -> None:
    """A done-callback: a waiter that was cancelled never reads its future's exception, so nothing logs it."""
    if not fut.cancelled():
        fut.exception()
