"""Wake-ups between the simulated processes: what `bc.store.notify.PgRelay` (LISTEN/NOTIFY) does between
`bc serve` processes on one PostgreSQL, in memory and at once.

Each process has its own `Bus`; `BusHub.join(bus)` relays that bus's wake-ups (a node poke, new events) to
every other bus joined, through their `local_*` calls, as the relay delivers
another process's NOTIFY. A process that dies or stops `leave`s. Wake-ups carry no data (whoever wakes
re-reads the store), so a relay that delivers at once rather than a few milliseconds later changes timing,
never correctness.
"""

from __future__ import annotations

from bc.control.base.bus import Bus


class _Relay:
    """One bus's relay: what it sends reaches every other bus of the hub."""

    def __init__(self, hub: BusHub, bus: Bus) -> None:
        self.hub, self.bus = hub, bus

    def node_changed(self, node_id: str) -> None:
        for other in self.hub.others(self.bus):
            other.local_node_changed(node_id)

    def events_published(self) -> None:
        for other in self.hub.others(self.bus):
            other.local_events_published()


class BusHub:
    """The buses of the processes that are running, in the order they joined."""

    def __init__(self) -> None:
        self._buses: list[Bus] = []

    def join(self, bus: Bus) -> None:
        if bus not in self._buses:
            self._buses.append(bus)
            bus.relay_to(_Relay(self, bus))

    def leave(self, bus: Bus) -> None:
        if bus in self._buses:
            self._buses.remove(bus)
            bus.relay_to(None)

    def others(self, bus: Bus) -> list[Bus]:
        return [b for b in self._buses if b is not bus]
