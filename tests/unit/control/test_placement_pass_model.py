"""The wired placement pass as a Hypothesis model over a real store: random reserve (now or a window, on
any node or a named one), release, node reports, node down/up/cordon, time passing, and passes that crash
at a random write (the transaction rolls back; the loop's pass carries on from its last committed pass, or
a fresh pass with nothing in memory does, as a restarted `bc serve`). The loop's passes are incremental
whenever nothing but the queue's end changed since the last. After every step: I1 over every booking in
effect (stored), I5 (connectivity never ends or frees a hold), I8 over the stored usage windows plus the
open ones, and after every pass that committed, the same facts at the same instant plan nothing more to
place, and I7 holds."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from agent.hw.fake import FakeHardware
from bc.control.base.bus import Bus
from bc.control.capacity import placement_pass as pp_mod
from bc.control.capacity.invariants import check_billing_conservation, check_no_overlap, check_nothing_placeable_pending
from bc.control.capacity.placement_pass import PlacementPass, load_facts, span_of
from bc.control.capacity.placement_plan import Booking, Wait, plan
from bc.control.capacity.reservations import ReserveRequest, on_allocation_report, release, reserve
from bc.control.capacity.usage_windows import open_window
from bc.control.capacity.views import window_of
from bc.control.signing.signer import NullSigner
from bc.errors import BcError
from bc.protocol.atoms import parse_atom
from bc.seams.clock import LoopClock
from bc.store import capacity as cap_sql
from bc.store import nodes as nodes_sql
from bc.store.sqlite import InlineSqliteStore
from bc.testing import advance, virtual_clock
from tests.unit.control.conftest import write_inventory

NODES = {"n1": "l4-slots-4", "n2": "hgx-h100-8"}
SIGNER = NullSigner()


class Crash(Exception):
    """The process died here: the open transaction rolls back."""


reserve_args = st.fixed_dictionaries(
    {
        "gpus": st.integers(1, 9),
        "node": st.sampled_from([None, None, "n1", "n2"]),
        "start_s": st.sampled_from([None, None, 0, 600, 3600, 5400]),
        "duration_s": st.sampled_from([None, 900, 3600, 7200]),
    }
)
actions = st.lists(
    st.one_of(
        st.tuples(st.just("reserve"), reserve_args),
        st.tuples(st.just("reserve"), reserve_args),
        st.tuples(st.just("reserve"), reserve_args),
        st.tuples(st.just("release"), st.integers(0, 9)),
        st.tuples(st.just("report"), st.integers(0, 9)),  # the node binds or releases what it was told
        st.tuples(st.just("refuse"), st.integers(0, 9)),  # the node's admission refuses what it was told
        st.tuples(st.just("advance"), st.sampled_from([60, 900, 1800, 3600])),
        st.tuples(
            st.just("down"),
            st.tuples(st.sampled_from(list(NODES)), st.sampled_from(["disconnected", "unreachable", "cordon"])),
        ),
        st.tuples(st.just("up"), st.sampled_from(list(NODES))),
        st.tuples(st.just("crash"), st.integers(1, 4)),  # the n-th booking write of the next pass dies
    ),
    min_size=4,
    max_size=24,
)


async def in_effect(store: InlineSqliteStore) -> list[Booking]:
    """Every booking that was ever in effect (one released before it started never was)."""
    async with store.transaction(write=False) as tx:
        rows = await tx.fetchall(
            "SELECT reservation_id, node_id, device_class, atom_id, start_ms, end_ms, released_at_ms"
            " FROM device_bookings ORDER BY reservation_id, atom_id"
        )
    grouped: dict[str, list[Any]] = {}
    for r in rows:
        if r["released_at_ms"] is not None and int(r["released_at_ms"]) <= int(r["start_ms"]):
            continue
        grouped.setdefault(str(r["reservation_id"]), []).append(r)
    return [
        Booking(
            rid,
            str(rs[0]["node_id"]),
            tuple(parse_atom(str(r["device_class"]), str(r["atom_id"])) for r in rs),
            int(rs[0]["start_ms"]),
            None if rs[0]["end_ms"] is None else int(rs[0]["end_ms"]),
        )
        for rid, rs in grouped.items()
    ]


async def billing(store: InlineSqliteStore) -> None:
    now = await store.now_ms()
    async with store.transaction(write=False) as tx:
        windows = [window_of(r) for r in await cap_sql.usage_windows(tx, None, None)]
        flushed = {str(r["id"]): r["flushed_ms"] for r in await cap_sql.unflushed_spans(tx)}
        rows = await cap_sql.billing_spans(tx)  # current placements and the ones a node refused
    spans = [span_of(r) for r in rows]
    for s in spans:
        if s.reservation_id in flushed:
            f = flushed[s.reservation_id]
            w = open_window(s, None if f is None else int(f), now)
            if w is not None:
                windows.append(w)
    assert check_billing_conservation(spans, windows, now) is None


async def live_holds(store: InlineSqliteStore) -> set[tuple[str, str]]:
    async with store.transaction(write=False) as tx:
        rows = await tx.fetchall("SELECT reservation_id, atom_id FROM device_bookings WHERE released_at_ms IS NULL")
    return {(str(r["reservation_id"]), str(r["atom_id"])) for r in rows}


async def quiet_after_pass(store: InlineSqliteStore) -> None:
    """The pass left nothing it could place: the same facts at the same instant plan no placement, and I7."""
    now = await store.now_ms()
    async with store.transaction(write=False) as tx:
        facts = await load_facts(tx)
    p = plan(facts.nodes, facts.bookings, facts.pending, now)
    assert p.placements == (), p.placements
    waiting = {o.reservation_id: o for o in p.outcomes if isinstance(o, Wait)}
    pending = [(r, waiting[r.reservation_id].held) for r in facts.pending if r.reservation_id in waiting]
    live = [b for b in facts.bookings if b.end_ms is None or b.end_ms > now]
    assert check_nothing_placeable_pending(facts.nodes, live, pending, now) is None


async def run(tmp: Path, clock: LoopClock, steps: list[tuple[str, Any]], monkeypatch: pytest.MonkeyPatch) -> None:
    store = InlineSqliteStore(tmp / "placement.db", clock)
    await store.open()
    bus = Bus()
    rng = random.Random(5)
    try:
        for n, profile in NODES.items():
            async with store.transaction() as tx:
                await nodes_sql.ensure(tx, n, "node", 0)
                await nodes_sql.set_connectivity(tx, n, "connected", 0)
            inv = FakeHardware(profile, n).inventory()
            del inv.numa_nodes[:]
            await write_inventory(store, n, inv)
        crash = {"at": 0, "n": 0}
        real_book = cap_sql.book_atom

        async def booking(*a: Any, **kw: Any) -> None:
            crash["n"] += 1
            if crash["at"] and crash["n"] >= crash["at"]:
                crash["at"] = 0
                raise Crash()
            await real_book(*a, **kw)

        monkeypatch.setattr(pp_mod.cap_sql, "book_atom", booking)
        ids: list[str] = []
        # The loop's pass, which keeps its last committed pass's state and decides only what is new when
        # nothing else changed (`PlacementPass.step`).
        loop = PlacementPass(store, bus, SIGNER, rng, holder="w")
        crashes = 0
        for kind, arg in steps:
            crash["n"] = 0
            before = await live_holds(store)
            if kind == "reserve":
                now = await store.now_ms()
                req = ReserveRequest(
                    gpus=arg["gpus"],
                    node_id=arg["node"] or "",
                    start_ms=None if arg["start_s"] is None else now + arg["start_s"] * 1000,
                    duration_ms=None if arg["duration_s"] is None else arg["duration_s"] * 1000,
                )
                try:
                    ids.append(str((await reserve(store, bus, SIGNER, req, rng))["id"]))
                except Crash:
                    event("reserve crashed")
                except BcError:
                    event("reserve refused")
            elif kind == "release" and ids:
                await release(store, bus, SIGNER, ids[arg % len(ids)])
            elif kind == "report" and ids:
                rid = ids[arg % len(ids)]
                async with store.transaction() as tx:
                    row = await tx.fetchone("SELECT * FROM reservations WHERE id = :i", {"i": rid})
                    assert row is not None
                    what = {"placed": "bound", "releasing": "released"}.get(str(row["state"]))
                    if what:
                        now = await store.now_ms()
                        await on_allocation_report(
                            tx, bus, SIGNER, str(row["node_id"]), what, str(row["allocation_id"]), "", "", now
                        )
            elif kind == "refuse" and ids:
                rid = ids[arg % len(ids)]
                async with store.transaction() as tx:
                    row = await tx.fetchone("SELECT * FROM reservations WHERE id = :i", {"i": rid})
                    assert row is not None
                    if str(row["state"]) == "placed":
                        now = await store.now_ms()
                        got = await on_allocation_report(
                            tx,
                            bus,
                            SIGNER,
                            str(row["node_id"]),
                            "failed",
                            str(row["allocation_id"]),
                            "resources-exhausted",
                            "no room",
                            now,
                        )
                        event(f"refused -> {got}")
                assert await live_holds(store) <= before, "a refusal booked something itself"
            elif kind == "advance":
                await advance(arg)
            elif kind in ("down", "up"):
                node, how = arg if kind == "down" else (arg, "up")
                now = await store.now_ms()
                async with store.transaction() as tx:
                    if how == "cordon":
                        await tx.execute("UPDATE nodes SET cordoned = 1 WHERE node_id = :n", {"n": node})
                    elif how == "up":
                        await tx.execute("UPDATE nodes SET cordoned = 0 WHERE node_id = :n", {"n": node})
                        await nodes_sql.set_connectivity(tx, node, "connected", now)
                    else:
                        await nodes_sql.set_connectivity(tx, node, how, now)
                assert await live_holds(store) == before, "a connectivity change freed a hold (I5)"
            elif kind == "crash":
                crash["at"] = int(arg)
            try:
                result = await loop.pass_once()
            except Crash:
                event("pass crashed")
                crashes += 1
                if crashes % 2:  # a restarted `bc serve`: a fresh pass, nothing in memory; else the loop goes on
                    loop = PlacementPass(store, bus, SIGNER, rng, holder="w")
            else:
                assert result is not None
                event(f"incremental={result.incremental}")
                await quiet_after_pass(store)
            overlap = check_no_overlap(await in_effect(store))
            assert overlap is None, overlap.sentence if overlap else ""
            await billing(store)
        event(f"reservations={min(len(ids), 5)}+")
    finally:
        await store.close()


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=actions)
def test_the_wired_pass_keeps_i1_i5_i7_i8_through_crashes(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch, steps: list[tuple[str, Any]]
) -> None:
    from bc.seams.virtual_time import run as run_virtual

    tmp = tmp_path_factory.mktemp("placement")
    with monkeypatch.context() as m:
        run_virtual(run(tmp, virtual_clock(), steps, m))


_ONE = {"gpus": 1, "node": None, "start_s": None, "duration_s": None}
_REFUSED_TWICE: list[tuple[str, Any]] = [("reserve", _ONE)] * 4 + [("refuse", 0), ("refuse", 0), ("release", 0)]


@settings(max_examples=1, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.just(_REFUSED_TWICE))
def test_releasing_a_hold_refused_twice_and_not_placed_again_frees_it(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch, steps: list[tuple[str, Any]]
) -> None:
    """Found by the model above: after two refusals a hold may be on no node at all; releasing it must not
    try to write the spec of a node it is not on (it raised NotFound for node 'None')."""
    from bc.seams.virtual_time import run as run_virtual

    with monkeypatch.context() as m:
        run_virtual(run(tmp_path_factory.mktemp("refused"), virtual_clock(), steps, m))
