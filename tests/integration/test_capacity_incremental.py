"""The incremental placement pass through the store, on SQLite and PostgreSQL: after a committed pass, the next
decides only the reservations submitted since and books what a full pass would (a `reserve` handed the
process's pass too); a change to the nodes, the
bookings or the queue (one released), or the plan's next wake coming, makes it a full pass again; and a pass
that rolled back leaves nothing of itself for the next one to go on from (docs/capacity.md)."""

from __future__ import annotations

import random
from typing import Any

import pytest

from agent.hw.fake import FakeHardware
from bc.control.base.bus import Bus
from bc.control.capacity import placement_pass as pp_mod
from bc.control.capacity.placement_pass import PassResult, PlacementPass, load_facts
from bc.control.capacity.placement_plan import Placement, Wait, plan
from bc.control.capacity.reservations import ReserveRequest, release, reserve
from bc.control.signing.signer import NullSigner
from bc.protocol.pb import common_pb2
from bc.store import Row, Store
from bc.store import capacity as cap_sql
from bc.store import nodes as nodes_sql
from bc.testing import advance
from tests.unit.conftest import clock, store_on_each_backend  # noqa: F401  (the unit suite's `store` fixture)
from tests.unit.control.conftest import write_inventory

pytestmark = pytest.mark.virtual_time

H = 3_600_000
SIGNER = NullSigner()


class Queue:
    """Pending reservations submitted straight into the store, as `reserve` inserts them (no inline pass)."""

    def __init__(self, store: Store) -> None:
        self.store, self.n = store, 0

    async def add(self, gpus: int, *, start_in_ms: int | None = None, duration_ms: int = H) -> str:
        self.n += 1
        rid = f"r{self.n:03d}"
        now = await self.store.now_ms()
        async with self.store.transaction() as tx:
            await cap_sql.insert_pending(
                tx,
                id_=rid,
                allocation_id=f"a{self.n:03d}",
                want_node_id=None,
                device_class="gpu",
                gpus=gpus,
                binding="hold",
                start_ms=None if start_in_ms is None else now + start_in_ms,
                end_ms=None,
                duration_ms=duration_ms,
                tenant="t",
                selector_json="{}",
                cpus=0,
                memory_bytes=0,
                hugepages_1g=0,
                now_ms=now,
            )
        return rid


async def fleet(store: Store, *nodes: str) -> None:
    for n in nodes:
        async with store.transaction() as tx:
            await nodes_sql.ensure(tx, n, "node", 0)
            await nodes_sql.set_connectivity(tx, n, "connected", 0)
        inv: common_pb2.Inventory = FakeHardware("hgx-h100-8", n).inventory()
        del inv.numa_nodes[:]
        await write_inventory(store, n, inv)


async def row(store: Store, rid: str) -> Row:
    async with store.transaction(write=False) as tx:
        got = await tx.fetchone("SELECT * FROM reservations WHERE id = :i", {"i": rid})
    assert got is not None
    return got


async def full_plan_now(store: Store) -> dict[str, Any]:
    """What a full pass would decide now, from the stored facts, by reservation."""
    now = await store.now_ms()
    async with store.transaction(write=False) as tx:
        facts = await load_facts(tx)
    return {o.reservation_id: o for o in plan(facts.nodes, facts.bookings, facts.pending, now).outcomes}


async def passed(p: PlacementPass) -> PassResult:
    got = await p.pass_once(lease=False)
    assert got is not None
    return got


async def test_an_incremental_pass_books_what_a_full_pass_would(store: Store) -> None:
    await fleet(store, "n1", "n2")
    q = Queue(store)
    p = PlacementPass(store, Bus(), SIGNER, random.Random(7), holder="w")
    first = [await q.add(8), await q.add(4), await q.add(8)]  # n1 full, n2 half, the third waits an hour
    assert not (await passed(p)).incremental
    assert [str((await row(store, r))["node_id"] or "") for r in first] == ["n1", "n2", ""]

    new = [await q.add(2), await q.add(8), await q.add(4)]
    expected = await full_plan_now(store)
    got = await passed(p)
    assert got.incremental
    assert got.plan.outcomes == tuple(expected[r] for r in new)  # only the new ones, as a full pass decides them
    assert isinstance(got.plan.outcomes[0], Placement) and got.plan.outcomes[0].node_id == "n2"  # backfilled
    assert [type(o) for o in got.plan.outcomes[1:]] == [Wait, Wait]
    assert str((await row(store, new[0]))["node_id"]) == "n2"
    for o in got.plan.waits:
        assert str((await row(store, o.reservation_id))["reason"]) == o.reason
    assert str((await row(store, first[2]))["reason"]) == expected[first[2]].reason  # the old one's, kept

    quiet = await passed(p)  # nothing new: nothing decided, nothing written
    assert quiet.incremental and quiet.plan.outcomes == ()


@pytest.mark.parametrize("change", ["node", "booking", "released", "next-wake"])
async def test_any_other_change_makes_the_next_pass_a_full_one(store: Store, change: str) -> None:
    await fleet(store, "n1", "n2")
    q = Queue(store)
    p = PlacementPass(store, Bus(), SIGNER, random.Random(7), holder="w")
    later = await q.add(1, start_in_ms=2 * H, duration_ms=H // 2)  # booked on n1 now, for a window in 2 hours
    waiting = [await q.add(8), await q.add(8), await q.add(8)]  # the third waits
    assert not (await passed(p)).incremental
    assert (await passed(p)).incremental
    assert str((await row(store, later))["state"]) == "pending" and (await row(store, later))["node_id"] is not None
    if change == "node":
        async with store.transaction() as tx:
            await tx.execute("UPDATE nodes SET cordoned = 1 WHERE node_id = 'n2'")
    elif change == "booking":
        await release(store, Bus(), SIGNER, later)  # booked, not delivered: its booking freed at once
    elif change == "released":
        await release(store, Bus(), SIGNER, waiting[2])  # the queue lost one it had planned
    else:
        assert p.next_wake_ms is not None
        await advance((p.next_wake_ms - await store.now_ms()) / 1000)
    new = await q.add(1)
    expected = await full_plan_now(store)
    got = await passed(p)
    assert not got.incremental
    assert {o.reservation_id: o for o in got.plan.outcomes} == expected
    assert (await passed(p)).incremental  # and the pass after it goes on from it
    assert new in expected


async def test_a_pass_rolled_back_leaves_nothing_to_go_on_from(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    await fleet(store, "n1")
    q = Queue(store)
    p = PlacementPass(store, Bus(), SIGNER, random.Random(7), holder="w")
    await q.add(4)
    assert not (await passed(p)).incremental
    kept = p.kept
    rid = await q.add(2)

    async def dies(*a: object, **kw: object) -> None:
        raise RuntimeError("the process died mid-pass")

    monkeypatch.setattr(pp_mod.cap_sql, "book_atom", dies)
    with pytest.raises(RuntimeError):
        await p.pass_once(lease=False)
    monkeypatch.undo()
    assert p.kept is kept  # the rolled-back pass kept nothing of its own: its placement was never stored
    assert (await row(store, rid))["node_id"] is None
    got = await passed(p)
    assert got.incremental and [o.reservation_id for o in got.plan.placements] == [rid]
    assert str((await row(store, rid))["node_id"]) == "n1"


async def test_a_reserve_handed_the_process_s_pass_decides_only_its_own_reservation(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`bc serve` hands its placement loop's pass to `reserve`: the inline pass goes on from the last committed
    one instead of re-planning the whole queue on every submit, and decides what a full pass would."""
    await fleet(store, "n1", "n2")
    q = Queue(store)
    p = PlacementPass(store, Bus(), SIGNER, random.Random(7), holder="w")
    waiting = [await q.add(8), await q.add(8), await q.add(8)]  # both nodes full, the third waits
    assert not (await passed(p)).incremental
    full_plans: list[int] = []
    whole = pp_mod.plan_and_keep

    def counted(*a: Any) -> Any:
        full_plans.append(len(a[2]))  # how many pending reservations it planned
        return whole(*a)

    monkeypatch.setattr(pp_mod, "plan_and_keep", counted)
    mine = await reserve(store, Bus(), SIGNER, ReserveRequest(gpus=4), random.Random(1), placement=p)
    assert full_plans == []  # decided on the kept state, the queue not planned again
    expected = await full_plan_now(store)
    assert str(mine["state"]) == "pending" and str(mine["reason"]) == expected[str(mine["id"])].reason
    assert str((await row(store, waiting[2]))["reason"]) == expected[waiting[2]].reason
    quiet = await passed(p)  # the loop's next pass goes on from the reserve's
    assert quiet.incremental and quiet.plan.outcomes == ()

    await reserve(store, Bus(), SIGNER, ReserveRequest(gpus=4), random.Random(2))  # no pass handed: a full one
    assert full_plans == [3]  # the two waiting before it and itself
