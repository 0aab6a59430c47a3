"""Where the agent's blocking calls run: a worker thread in production, inline on a virtual-time loop.

File reads and writes (identity.json, CDI specs, env files), NVML calls and
the fake hardware's state files block. On the ordinary loop they go to a
thread (`asyncio.to_thread`), so heartbeats keep time while a disk is slow.
On a virtual-time loop a thread breaks the clock: the loop sees every task
waiting, jumps to the next timer while the thread still works, and a run no
longer depends on its seed alone. The simulator therefore passes `inline`,
which runs the call on the loop (its files are small, its hardware fake).

The agent is handed one `Offload` (`agent.app.AgentParts.offload`) and uses
it for every blocking call on its own paths; what still reaches a thread
another way is listed in docs/design.md ("The agent's parts").
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import ParamSpec, Protocol, TypeVar

P = ParamSpec("P")
T = TypeVar("T")


class Offload(Protocol):
    async def __call__(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T: ...


async def inline(fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
    """Run the call on the loop: for a virtual-time loop, where a thread would let time jump under it."""
    return fn(*args, **kwargs)


to_thread: Offload = asyncio.to_thread
"""Production: a worker thread, so the loop keeps serving the session while the call blocks."""
