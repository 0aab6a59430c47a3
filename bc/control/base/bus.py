"""In-process wake-ups after commit: pokes to a node's gateway, new events for watchers.

A wake-up carries no data; whoever wakes re-reads the store, so a lost or
duplicated wake-up costs latency, never correctness (the 1 s and 10 s
backstops catch up). With several processes on PostgreSQL a `Relay`
(`bc.store.notify.PgRelay`, LISTEN/NOTIFY) carries every wake-up to the
other processes too, and brings theirs in through the `local_*` calls;
callers do not change.

The bus only wakes things up: it carries no policy. What signs intent is a
`bc.control.signing.signer.Signer`, passed to every writer explicitly.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol

from bc.runtime.aio import wait_event

EVENT_GAP_S = 0.2
"""How often a background reader woken by events (a stream's caller check, the serving-certificate loops) looks
at most: a fleet's commands publish events by the hundred a second, and a read transaction for each event was
several of `bc serve`'s milliseconds of CPU per command (docs/scale.md). What it waits for is late by at most
this much; a wake-up lost meanwhile is not (the next look reads the store)."""


class Relay(Protocol):
    """Carries this process's wake-ups to the other processes on the store."""

    def node_changed(self, node_id: str) -> None: ...

    def events_published(self) -> None: ...


class Bus:
    """Wake-ups: node pokes, new events."""

    def __init__(self) -> None:
        self._node_listeners: list[Callable[[str], None]] = []
        self._events = asyncio.Event()
        self.published = 0  # events committed through this bus: `bc serve --otlp-endpoint` counts them
        self._relay: Relay | None = None

    def relay_to(self, relay: Relay | None) -> None:
        self._relay = relay

    # -- pokes ---------------------------------------------------------
    def on_node_changed(self, fn: Callable[[str], None]) -> None:
        self._node_listeners.append(fn)

    def node_changed(self, node_id: str) -> None:
        self.local_node_changed(node_id)
        if self._relay is not None:
            self._relay.node_changed(node_id)

    def local_node_changed(self, node_id: str) -> None:
        """A poke for this process's listeners only (one another process sent)."""
        for fn in self._node_listeners:
            fn(node_id)

    # -- the events log ------------------------------------------------
    def events_published(self) -> None:
        self.published += 1
        self.local_events_published()
        if self._relay is not None:
            self._relay.events_published()

    def local_events_published(self) -> None:
        self._events.set()
        self._events = asyncio.Event()

    async def wait_events(self, timeout: float) -> None:  # noqa: ASYNC109 (a bounded wake-up, not a deadline)
        await wait_event(self._events, timeout)

    async def wait_events_spaced(self, timeout: float) -> None:  # noqa: ASYNC109 (as `wait_events`)
        """`wait_events`, then `EVENT_GAP_S` more: the events of a burst are answered by one look."""
        await wait_event(self._events, timeout)
        await asyncio.sleep(EVENT_GAP_S)
