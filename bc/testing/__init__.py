"""Wiring for tests and the simulator: the virtual-time loop and in-memory links.

These are fakes at seams we own (the loop's clock and the Link), shipped with
the code so the simulator and every test use the same ones. Time in tests is
the virtual loop's (`bc.seams.virtual_time`): `virtual_clock()` reads it, `await
advance(s)` lets `s` seconds pass, `run(coro)` runs a program on a fresh loop.
`SessionPair` (from `bc.sim.pair`, loaded on first use: it pulls in the
whole control plane and agent) runs a control plane, a gateway and N agents
over these links on that loop.
"""

from __future__ import annotations

import asyncio
from typing import Generic, TypeVar

from bc.protocol import closing
from bc.protocol.pb.session_pb2 import CloseReason
from bc.seams.virtual_time import START, WALL_START, VirtualTimeLoop, advance, run, virtual_clock
from bc.wire.link import LinkClosed

__all__ = [
    "START",
    "WALL_START",
    "MemoryLink",
    "VirtualTimeLoop",
    "advance",
    "link_pair",
    "run",
    "virtual_clock",
]

T = TypeVar("T")
U = TypeVar("U")


def __getattr__(name: str) -> object:
    # Lazily: bc.sim.pair imports this module for its links, and the whole control plane besides.
    if name == "SessionPair":
        from bc.sim.pair import SessionPair

        return SessionPair
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


_CLOSE = object()


class MemoryLink(Generic[T, U]):
    """One end of an in-memory duplex link: receives T, sends U."""

    def __init__(self, inbox: asyncio.Queue[object], outbox: asyncio.Queue[object]) -> None:
        self._in = inbox
        self._out = outbox
        self.closed: tuple[str, str] | None = None
        self.close_reason: CloseReason = closing.UNSPECIFIED
        self.retry_after_ms: int | None = None

    async def send(self, msg: U) -> None:
        if self.closed is not None:
            raise LinkClosed(*self.closed, reason=self.close_reason, retry_after_ms=self.retry_after_ms)
        await self._out.put(msg)

    async def recv(self) -> T | None:
        item = await self._in.get()
        if isinstance(item, tuple) and item and item[0] is _CLOSE:
            self.closed, self.close_reason, self.retry_after_ms = (str(item[1]), str(item[2])), item[3], item[4]
            raise LinkClosed(*self.closed, reason=self.close_reason, retry_after_ms=self.retry_after_ms)
        return item  # type: ignore[return-value]

    async def close(
        self, code: str, details: str, reason: CloseReason = closing.UNSPECIFIED, *, retry_after_ms: int | None = None
    ) -> None:
        if self.closed is None:
            self.closed, self.close_reason, self.retry_after_ms = (code, details), reason, retry_after_ms
            # The typed reason and the retry-after, as gRPC's trailing metadata carries them.
            await self._out.put((_CLOSE, code, details, reason, retry_after_ms))


def link_pair() -> tuple[MemoryLink[T, U], MemoryLink[U, T]]:
    """Two connected ends: what one sends, the other receives, in order."""
    a: asyncio.Queue[object] = asyncio.Queue()
    b: asyncio.Queue[object] = asyncio.Queue()
    return MemoryLink(a, b), MemoryLink(b, a)
