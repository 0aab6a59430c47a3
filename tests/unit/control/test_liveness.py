"""The Liveness controller on the store's clock: connected, disconnected, unreachable, never a release."""

from __future__ import annotations

import contextlib
import json
import random
from collections.abc import Awaitable, Callable

import pytest

from bc.control.base.bus import Bus
from bc.control.capacity.reservations import ReserveRequest, reserve
from bc.control.nodes.liveness import STALL_HOLD_MS, Liveness, LivenessConfig
from bc.control.signing.signer import NullSigner
from bc.protocol.pb import common_pb2
from bc.seams.clock import LoopClock
from bc.store import Row, Store, StoreError, Tx
from bc.store import events as events_sql
from bc.store import leases as leases_sql
from bc.store import nodes as nodes_sql
from bc.store.sqlite import InlineSqliteStore
from bc.testing import advance

SIGNER = NullSigner()  # signing off, explicitly: a test of signing makes a KeySigner
RNG = random.Random(1)  # ids and serials, as the one seeded Random of a process would give them

AddNode = Callable[..., Awaitable[common_pb2.Inventory]]

GW = "gw-1"
GW_LEASE_MS = 20_000
CFG = LivenessConfig()  # lease TTL 40 s, grace 120 s
STEP = 10.0  # sweep period in these tests: well under the 20 s stall gap


async def gateway_lease(store: Store, gateway_id: str = GW) -> bool:
    """A live gateway renews its lease and flushes last-seen for the sessions it holds, as `Gateway` does."""
    now_ms = await store.now_ms()
    async with store.transaction() as tx:
        held = await leases_sql.acquire(tx, f"gateway:{gateway_id}", gateway_id, now_ms, GW_LEASE_MS)
        if held:
            for s in await nodes_sql.sessions_routed_to(tx, gateway_id):
                await nodes_sql.mark_seen(tx, str(s["node_id"]), int(s["session_epoch"]), now_ms)
        return held


async def open_session(store: InlineSqliteStore, node_id: str = "n1", gateway_id: str = GW) -> int:
    now_ms = await store.now_ms()
    async with store.transaction() as tx:
        opened = await nodes_sql.open_session(
            tx,
            node_id=node_id,
            gateway_id=gateway_id,
            journal_id="j-1",
            boot_id="b-1",
            incarnation_id="i-1",
            cert_serial="01",
            now_ms=now_ms,
        )
    return opened.epoch


async def connectivity(store: InlineSqliteStore, node_id: str = "n1") -> str:
    async with store.transaction(write=False) as tx:
        row = await nodes_sql.get(tx, node_id)
    assert row is not None
    return str(row["connectivity"])


async def connectivity_events(store: InlineSqliteStore) -> list[tuple[str, str]]:
    async with store.transaction(write=False) as tx:
        rows = await events_sql.list_events(tx, 0, 1000, "node.connectivity")
    return [(str(r["subject"]), json.loads(str(r["data"]))["state"]) for r in rows]


async def reservations_snapshot(store: InlineSqliteStore) -> tuple[list[Row], list[Row]]:
    async with store.transaction(write=False) as tx:
        return (
            await tx.fetchall("SELECT * FROM reservations ORDER BY id"),
            await tx.fetchall("SELECT * FROM device_bookings ORDER BY reservation_id, atom_id"),
        )


async def run_for(
    liveness: Liveness, clock: LoopClock, seconds: float, live_gateways: tuple[str, ...] = ()
) -> list[tuple[str, str]]:
    """Sweep every STEP seconds for `seconds`, the live gateways renewing; returns the transitions made."""
    out: list[tuple[str, str]] = []
    t = 0.0
    while t < seconds:
        await advance(STEP)
        t += STEP
        for gw in live_gateways:
            assert await gateway_lease(liveness.store, gw)
        out.extend(await liveness.sweep_once())
    return out


async def test_a_node_on_a_live_gateway_stays_connected(
    store: InlineSqliteStore, bus: Bus, clock: LoopClock, add_node: AddNode
) -> None:
    await add_node("n1")
    await gateway_lease(store)
    await open_session(store)
    lv = Liveness(store, bus, "worker-1", CFG)
    assert await lv.sweep_once() == []
    for _ in range(30):  # 5 minutes, the gateway renewing its lease
        await advance(STEP)
        assert await gateway_lease(store)
        assert await lv.sweep_once() == []
    assert await connectivity(store) == "connected"
    assert await connectivity_events(store) == []


async def test_gateway_lease_expiry_disconnects_then_unreachable_after_ttl_and_grace(
    store: InlineSqliteStore, bus: Bus, clock: LoopClock, add_node: AddNode
) -> None:
    await add_node("n1")
    await add_node("n2")
    await gateway_lease(store)
    epoch = await open_session(store, "n1")
    await gateway_lease(store, "gw-2")
    await open_session(store, "n2", "gw-2")
    lv = Liveness(store, bus, "worker-1", CFG)
    assert await lv.sweep_once() == []
    # gw-1 dies (stops renewing); gw-2 keeps renewing
    transitions: list[tuple[str, str]] = []
    for _ in range(3):
        await advance(STEP)
        await gateway_lease(store, "gw-2")
        transitions.extend(await lv.sweep_once())
    assert transitions == [("n1", "disconnected")]
    assert await connectivity(store, "n1") == "disconnected"
    assert await connectivity(store, "n2") == "connected"
    assert await connectivity_events(store) == [("n1", "disconnected")]
    async with store.transaction(write=False) as tx:
        assert not await nodes_sql.session_is_current(tx, "n1", epoch)

    disconnected_at = await store.now_ms()
    # not yet unreachable: well inside lease TTL + grace since the gateway was last heard
    for _ in range(int((CFG.lease_ttl_ms + CFG.unreachable_grace_ms) / 1000 / STEP) - 3):
        await advance(STEP)
        await gateway_lease(store, "gw-2")
        assert await lv.sweep_once() == []
    assert await connectivity(store, "n1") == "disconnected"
    # lease TTL + grace after the disconnect: unreachable
    while await store.now_ms() - disconnected_at <= CFG.lease_ttl_ms + CFG.unreachable_grace_ms:
        await advance(STEP)
        await gateway_lease(store, "gw-2")
        transitions.extend(await lv.sweep_once())
    assert transitions == [("n1", "disconnected"), ("n1", "unreachable")]
    assert await connectivity(store, "n1") == "unreachable"
    assert await connectivity(store, "n2") == "connected"
    assert await connectivity_events(store) == [("n1", "disconnected"), ("n1", "unreachable")]
    # and it stays there: no more transitions
    assert await run_for(lv, clock, 60, ("gw-2",)) == []
    assert await connectivity(store, "n2") == "connected"


async def test_a_stale_close_does_not_close_a_newer_session(
    store: InlineSqliteStore, bus: Bus, clock: LoopClock, add_node: AddNode
) -> None:
    await add_node("n1")
    await gateway_lease(store)
    old = await open_session(store, "n1", GW)
    await gateway_lease(store, "gw-2")
    new = await open_session(store, "n1", "gw-2")
    assert new > old
    now_ms = await store.now_ms()
    async with store.transaction() as tx:
        assert await nodes_sql.close_session(tx, "n1", old, now_ms) is False
    async with store.transaction(write=False) as tx:
        assert await nodes_sql.session_is_current(tx, "n1", new)
    assert await connectivity(store) == "connected"
    # the old gateway dies: the node, now on gw-2, is untouched
    lv = Liveness(store, bus, "worker-1", CFG)
    for _ in range(5):
        await advance(STEP)
        await gateway_lease(store, "gw-2")
        assert await lv.sweep_once() == []
    assert await connectivity(store) == "connected"
    async with store.transaction() as tx:
        assert await nodes_sql.close_session(tx, "n1", new, now_ms) is True
    assert await connectivity(store) == "disconnected"


async def test_a_sweep_gap_holds_unreachable_transitions_for_five_minutes(
    store: InlineSqliteStore, bus: Bus, clock: LoopClock, add_node: AddNode
) -> None:
    await add_node("n1")
    await gateway_lease(store)
    await open_session(store)
    lv = Liveness(store, bus, "worker-1", CFG)
    await lv.sweep_once()
    assert await run_for(lv, clock, 30) == [("n1", "disconnected")]
    disconnected_at = await store.now_ms()
    await run_for(lv, clock, 100)
    # the store (or this process) stalls for 30 s, past the point where n1 would go unreachable
    await advance(30 + (CFG.lease_ttl_ms + CFG.unreachable_grace_ms) / 1000)
    stalled_at = await store.now_ms()
    assert stalled_at - disconnected_at > CFG.lease_ttl_ms + CFG.unreachable_grace_ms
    assert await lv.sweep_once() == []
    held = await run_for(lv, clock, STALL_HOLD_MS / 1000 - 2 * STEP)
    assert held == []
    assert await connectivity(store) == "disconnected"
    assert await run_for(lv, clock, 3 * STEP) == [("n1", "unreachable")]


async def test_liveness_never_touches_reservations(
    store: InlineSqliteStore, bus: Bus, clock: LoopClock, add_node: AddNode
) -> None:
    await add_node("n1")
    placed = await reserve(store, bus, SIGNER, ReserveRequest(gpus=2, node_id="n1"), RNG)
    await reserve(store, bus, SIGNER, ReserveRequest(gpus=1, node_id="n1"), RNG)
    async with store.transaction() as tx:
        await tx.execute("UPDATE reservations SET state = 'active' WHERE id = :id", {"id": placed["id"]})
    await gateway_lease(store)
    await open_session(store)
    before = await reservations_snapshot(store)
    lv = Liveness(store, bus, "worker-1", CFG)
    await lv.sweep_once()
    transitions = await run_for(lv, clock, 400)
    assert transitions == [("n1", "disconnected"), ("n1", "unreachable")]
    assert await reservations_snapshot(store) == before
    assert len(before[0]) == 2 and len(before[1]) == 3


async def test_only_one_liveness_worker_sweeps(
    store: InlineSqliteStore, bus: Bus, clock: LoopClock, add_node: AddNode
) -> None:
    await add_node("n1")
    await gateway_lease(store)
    await open_session(store)
    a = Liveness(store, bus, "worker-a", CFG)
    b = Liveness(store, bus, "worker-b", CFG)
    await a.sweep_once()
    await advance(25)  # the gateway lease is gone; worker-a still holds the liveness lease (15 s, renewed)
    await a.sweep_once()
    assert await connectivity_events(store) == [("n1", "disconnected")]
    assert await b.sweep_once() == []


async def test_a_session_its_gateway_stopped_flushing_is_closed_after_the_lease_ttl(
    store: InlineSqliteStore, bus: Bus, clock: LoopClock, add_node: AddNode
) -> None:
    """A live gateway that lost track of a session (its handler died before the close write)."""
    await add_node("n1")
    await gateway_lease(store)
    epoch = await open_session(store)
    lv = Liveness(store, bus, "worker-1", CFG)
    transitions = []
    for _ in range(5):  # 50 s: the lease renewed, but no last-seen flush for this session
        await advance(STEP)
        now_ms = await store.now_ms()
        async with store.transaction() as tx:
            assert await leases_sql.acquire(tx, f"gateway:{GW}", GW, now_ms, GW_LEASE_MS)
        transitions.extend(await lv.sweep_once())
    assert transitions == [("n1", "disconnected")]
    async with store.transaction(write=False) as tx:
        assert not await nodes_sql.session_is_current(tx, "n1", epoch)


async def test_a_store_outage_is_a_sweep_gap_though_the_sweeps_kept_trying(
    store: InlineSqliteStore, bus: Bus, clock: LoopClock, add_node: AddNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reference "PostgreSQL unavailable": the liveness loop keeps calling `sweep_once` every second while the
    store is out, and each call fails at its transaction. Those attempts are no sweeps: the first sweep after
    the outage sees the whole gap and holds timed transitions back, so a session whose gateway could not
    flush its ages through the outage is not closed as silent (and its node not marked unreachable) before
    the fleet had time to reconnect. (Found by `bc sim --gateways 3`'s store outages: the attempts used to
    reset the gap.)"""
    await add_node("n1")
    await gateway_lease(store)
    await open_session(store)
    lv = Liveness(store, bus, "worker-1", CFG)
    await lv.sweep_once()
    real = store.transaction

    def out(*, write: bool = True) -> contextlib.AbstractAsyncContextManager[Tx]:
        raise StoreError("the store is unavailable")

    monkeypatch.setattr(store, "transaction", out)
    for _ in range(60):  # a minute of outage, a sweep attempt every second
        await advance(1.0)
        with pytest.raises(StoreError):
            await lv.sweep_once()
    monkeypatch.setattr(store, "transaction", real)
    # The gateway renews again but its streams were dropped at its fence: nothing flushes n1's age.
    now_ms = await store.now_ms()
    async with store.transaction() as tx:
        assert await leases_sql.acquire(tx, f"gateway:{GW}", GW, now_ms, GW_LEASE_MS)
    transitions = []
    for _ in range(int(STALL_HOLD_MS / 1000 / STEP) - 2):
        transitions += await lv.sweep_once()
        await advance(STEP)
        now_ms = await store.now_ms()
        async with store.transaction() as tx:
            assert await leases_sql.acquire(tx, f"gateway:{GW}", GW, now_ms, GW_LEASE_MS)
    assert transitions == []
    assert await connectivity(store) == "connected"
