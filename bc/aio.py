"""Small asyncio helpers shared by the agent and the server.

Their timeouts are the running loop's time, like every `Clock` (`bc.clock`):
seconds of the host on the ordinary loop, virtual seconds on
`bc.virtual_time.VirtualTimeLoop`.
"""

from __future__ import annotations

import asyncio


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
