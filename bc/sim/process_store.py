"""The simulator's store as each process sees it: an outage of the one store, a paused or dead process.

There is one store in a simulated fleet (`OutageStore`, the inline SQLite store, standing for PostgreSQL),
and every simulated process reaches it through its own view:

* **a store outage** (`OutageStore.out`): every transaction of every process fails with `StoreError`,
  at BEGIN and at every statement of one already open (the connection went away under it), as a
  PostgreSQL that is down or failing over does; the store's clock still reads (production reads it
  locally between resyncs);
* **a paused process** (`ProcessStore`, `Pause`): a gateway whose host froze does nothing until it
  wakes, so its view makes every transaction and clock read wait for the wake first. It never waits
  inside a transaction: the one store has one writer's lock, which a frozen PostgreSQL client would not
  hold over the whole database (a statement already running finishes, as it does on the server);
* **a dead process** (`ProcessStore.kill`): its connections are gone, so what its tasks still try (the
  close writes of sessions that were running when it died) fails with `StoreError`, as nothing a
  crashed process meant to write ever reaches the store.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from bc.seams.clock import Clock
from bc.store import Store, StoreError, Tx
from bc.store.base import Params
from bc.store.sqlite import InlineSqliteStore, _Result


class OutageStore(InlineSqliteStore):
    """The inline SQLite store, which can be out: while `out`, every transaction fails (see the module)."""

    out = False

    @asynccontextmanager
    async def _begin(self, write: bool) -> AsyncIterator[Tx]:
        if self.out:
            raise StoreError("the store is unavailable (a simulated outage)")
        async with super()._begin(write) as tx:
            yield tx

    async def _run(self, sql: str, params: Params | None, *, fetch: bool, tuples: bool = False) -> _Result:
        if self.out:
            raise StoreError(f"the store is unavailable (a simulated outage) in: {sql.strip()[:60]}")
        return await super()._run(sql, params, fetch=fetch, tuples=tuples)


class Pause:
    """Whether a process runs: `wait()` returns at once while it does, else when it wakes."""

    def __init__(self) -> None:
        self._running = asyncio.Event()
        self._running.set()

    @property
    def paused(self) -> bool:
        return not self._running.is_set()

    def pause(self) -> None:
        self._running.clear()

    def wake(self) -> None:
        self._running.set()

    async def wait(self) -> None:
        if not self._running.is_set():
            await self._running.wait()


class ProcessStore(Store):
    """One process's connection to the shared store: waits while the process is paused, fails once it died.
    Opening and closing are the store owner's (the simulation's), not the process's."""

    def __init__(self, inner: Store, pause: Pause) -> None:
        self.inner, self.pause = inner, pause
        self.dialect = inner.dialect
        self.dead = False

    def kill(self) -> None:
        self.dead = True

    async def open(self, *, migrate: bool = True) -> None:
        del migrate

    async def close(self) -> None:
        pass

    @asynccontextmanager
    async def _begin(self, write: bool) -> AsyncIterator[Tx]:
        await self.pause.wait()
        if self.dead:
            raise StoreError("this process is gone: its connections with it")
        async with self.inner._begin(write) as tx:
            yield tx

    async def now(self) -> float:
        await self.pause.wait()
        return await self.inner.now()

    def for_update(self) -> str:
        return self.inner.for_update()

    @property
    def description(self) -> str:
        return f"{self.inner.description} (one process's view)"


class ProcessClock:
    """A process's clock: the clock it is given, whose sleeps end no earlier than the process's wake, so a
    paused process's timers fire late, all at once, when it wakes (and it reads the time then)."""

    def __init__(self, inner: Clock, pause: Pause) -> None:
        self.inner, self.pause = inner, pause

    def now(self) -> float:
        return self.inner.now()

    def monotonic(self) -> float:
        return self.inner.monotonic()

    async def sleep(self, seconds: float) -> None:
        await self.inner.sleep(seconds)
        await self.pause.wait()


__all__ = ["OutageStore", "Pause", "ProcessClock", "ProcessStore"]
