"""The pieces `bc sim --gateways N` builds its processes from: the store's outage, a paused or dead process's
view of it, and the wake-ups relayed between processes' buses."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from bc.control.base.bus import Bus
from bc.seams.virtual_time import run as run_virtual
from bc.seams.virtual_time import virtual_clock
from bc.sim.bus_hub import BusHub
from bc.sim.process_store import OutageStore, Pause, ProcessClock, ProcessStore
from bc.store import StoreError


def test_an_outage_fails_every_transaction_and_a_statement_inside_one(tmp_path: Path) -> None:
    async def go() -> None:
        store = OutageStore(tmp_path / "bc.db", virtual_clock())
        await store.open()
        async with store.transaction(write=False) as tx:
            assert await tx.fetchval("SELECT 1") == 1
        store.out = True
        with pytest.raises(StoreError, match="outage"):
            async with store.transaction(write=False):
                pass
        store.out = False
        with pytest.raises(StoreError, match="outage"):
            async with store.transaction() as tx:
                store.out = True  # the connection goes away mid-transaction
                await tx.fetchval("SELECT 1")
        store.out = False
        async with store.transaction(write=False) as tx:  # and it answers again, its lock free
            assert await tx.fetchval("SELECT 2") == 2
        await store.close()

    run_virtual(go())


def test_a_paused_process_waits_for_its_wake_and_a_dead_one_fails(tmp_path: Path) -> None:
    async def go() -> None:
        clock = virtual_clock()
        store = OutageStore(tmp_path / "bc.db", clock)
        await store.open()
        pause = Pause()
        view, pclock = ProcessStore(store, pause), ProcessClock(clock, pause)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        pause.pause()
        loop.call_later(30, pause.wake)
        async with view.transaction(write=False) as tx:  # waits for the wake, then runs
            assert await tx.fetchval("SELECT 1") == 1
        assert loop.time() - t0 == 30
        pause.pause()
        loop.call_later(10, pause.wake)
        await pclock.sleep(1)  # a timer of a frozen process fires when it wakes
        assert loop.time() - t0 == 40
        async with store.transaction(write=False) as tx:  # the others never waited on it
            assert await tx.fetchval("SELECT 1") == 1
        view.kill()
        with pytest.raises(StoreError, match="gone"):
            async with view.transaction():
                pass
        await view.close()  # the process does not own the store
        async with store.transaction(write=False) as tx:
            assert await tx.fetchval("SELECT 3") == 3
        await store.close()

    run_virtual(go())


def test_the_hub_relays_wake_ups_to_every_other_bus_until_one_leaves() -> None:
    a, b, c = Bus(), Bus(), Bus()
    hub = BusHub()
    for bus in (a, b, c):
        hub.join(bus)
    pokes: list[tuple[str, str]] = []
    for name, bus in (("a", a), ("b", b), ("c", c)):
        bus.on_node_changed(lambda node, name=name: pokes.append((name, node)))
    a.node_changed("n1")
    assert pokes == [("a", "n1"), ("b", "n1"), ("c", "n1")]  # its own listeners once, each other bus once
    hub.leave(b)
    pokes.clear()
    c.node_changed("n2")
    b.node_changed("n3")  # a bus that left reaches only itself
    assert pokes == [("c", "n2"), ("a", "n2"), ("b", "n3")]
