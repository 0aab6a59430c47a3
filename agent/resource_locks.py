"""Per-resource locks across lanes: two commands never act on one device at once.

Names are `gpu:<uuid>`, `disk:<id>`, `alloc:<id>`; `gpu:*` means every GPU
(a reboot, a DCGM run over all GPUs), so it conflicts with any `gpu:` lock.
A command takes all its names at once or waits: no lock-ordering deadlocks.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager


def conflicts(a: str, b: str) -> bool:
    if a == b:
        return True
    ka, _, ia = a.partition(":")
    kb, _, ib = b.partition(":")
    return ka == kb and (ia == "*" or ib == "*")


class ResourceLocks:
    def __init__(self) -> None:
        self._held: list[str] = []
        self._changed = asyncio.Condition()

    def _free(self, names: list[str]) -> bool:
        return not any(conflicts(n, h) for n in names for h in self._held)

    @asynccontextmanager
    async def hold(self, names: Iterable[str]) -> AsyncIterator[None]:
        wanted = sorted(set(names))
        async with self._changed:
            await self._changed.wait_for(lambda: self._free(wanted))
            self._held.extend(wanted)
        try:
            yield
        finally:
            async with self._changed:
                for n in wanted:
                    self._held.remove(n)
                self._changed.notify_all()
