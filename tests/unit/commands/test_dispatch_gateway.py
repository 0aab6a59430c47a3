"""The gateway's dispatch pass (bc.control.commands.dispatch.dispatch_gateway) on both stores: one transaction per
page of commands for every node it routes, the in-memory epoch fence, credits and lane order across pages,
the guards, Cancels, and (PostgreSQL) SKIP LOCKED and the share-locked session row."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable

import psycopg
import pytest

from bc.control.base.bus import Bus
from bc.control.commands.dispatch import SessionSends, dispatch_gateway
from bc.control.commands.queue import request_cancel
from bc.gateway.dispatcher import Dispatcher
from bc.protocol import kinds
from bc.seams.clock import LoopClock
from bc.store import Row, Store, postgres
from bc.store import commands as cmd_sql
from bc.store import nodes as nodes_sql
from bc.store.base import Params
from bc.store.postgres import PostgresStore
from bc.testing import advance

AddNode = Callable[..., Awaitable[None]]
Enqueue = Callable[..., Awaitable[Row]]
Events = Callable[[str], Awaitable[list[Row]]]


async def route(store: Store, node_id: str, gateway_id: str = "gw-1") -> int:
    """Open a session of `node_id` on `gateway_id` (a Hello's routing write); its epoch."""
    now_ms = await store.now_ms()
    async with store.transaction() as tx:
        opened = await nodes_sql.open_session(
            tx,
            node_id=node_id,
            gateway_id=gateway_id,
            journal_id="j1",
            boot_id="b1",
            incarnation_id="i1",
            cert_serial="s1",
            now_ms=now_ms,
        )
    return opened.epoch


async def state(store: Store, cid: str) -> Row:
    async with store.transaction(write=False) as tx:
        row = await cmd_sql.get(tx, cid)
    assert row is not None
    return row


async def fleet(store: Store, add_node: AddNode, n: int, gateway_id: str = "gw-1") -> dict[str, int]:
    epochs = {}
    for i in range(n):
        node_id = f"n{i:03d}"
        await add_node(node_id)
        epochs[node_id] = await route(store, node_id, gateway_id)
    return epochs


async def test_a_fleet_wide_command_costs_one_transaction_per_page(
    store: Store, bus: Bus, add_node: AddNode, put: Enqueue
) -> None:
    epochs = await fleet(store, add_node, 25)
    ids = {n: str((await put(n))["id"]) for n in epochs}

    done = await dispatch_gateway(store, bus, "gw-1", epochs, page=10)

    assert done.transactions == 3  # ceil(25 / 10), not 25
    assert sorted(done.sends) == sorted(epochs)
    for node_id, sends in done.sends.items():
        assert sends.epoch == epochs[node_id]
        assert [f.id for f in sends.commands] == [ids[node_id]]
        assert sends.commands[0].attempt == 1
        row = await state(store, ids[node_id])
        assert (row["state"], row["dispatched_epoch"]) == ("dispatched", epochs[node_id])
        assert sends.commands[0].body == bytes(row["body"])
    again = await dispatch_gateway(store, bus, "gw-1", epochs, page=10)
    assert again.sends == {} and again.transactions == 0  # a read found nothing: no write transaction


async def test_only_the_sessions_this_gateway_holds_at_its_own_epoch_are_sent_to(
    store: Store, bus: Bus, add_node: AddNode, put: Enqueue
) -> None:
    epochs = await fleet(store, add_node, 3)
    elsewhere = await route(store, "n001", "gw-2")  # n001's session moved to gw-2
    moved_here = await route(store, "n002")  # n002 said Hello again here; gw-1 still holds the old session
    a, b, c = [str((await put(n))["id"]) for n in ("n000", "n001", "n002")]

    done = await dispatch_gateway(store, bus, "gw-1", epochs)
    assert sorted(done.sends) == ["n000"]
    assert (await state(store, b))["state"] == "pending"
    assert (await state(store, c))["state"] == "pending"  # not on an epoch this gateway does not hold

    done = await dispatch_gateway(store, bus, "gw-2", {"n001": elsewhere})
    assert [f.id for f in done.sends["n001"].commands] == [b]
    done = await dispatch_gateway(store, bus, "gw-1", {**epochs, "n002": moved_here})
    assert [f.id for f in done.sends["n002"].commands] == [c]
    assert (await state(store, a))["dispatched_epoch"] == epochs["n000"]


async def test_credits_and_lane_order_hold(store: Store, bus: Bus, add_node: AddNode, put: Enqueue) -> None:
    epochs = await fleet(store, add_node, 2)
    first = [str((await put("n000"))["id"]) for _ in range(12)]  # control lane: 8 credits
    bulk = [str((await put("n000", "logs.collect"))["id"]) for _ in range(3)]  # bulk lane: 2 credits
    other = str((await put("n001"))["id"])

    done = await dispatch_gateway(store, bus, "gw-1", epochs, page=4)
    credits = kinds.GATEWAY_CREDITS
    assert [f.id for f in done.sends["n000"].commands] == first[: credits["control"]] + bulk[: credits["bulk"]]
    assert [f.id for f in done.sends["n001"].commands] == [other]  # n000's backlog does not starve n001
    assert done.transactions == 1  # two nodes: one page of nodes


async def test_a_pass_over_the_poked_nodes_reads_and_sends_to_those_only(
    store: Store, bus: Bus, add_node: AddNode, put: Enqueue
) -> None:
    epochs = await fleet(store, add_node, 3)
    ids = {n: str((await put(n))["id"]) for n in epochs}
    done = await dispatch_gateway(store, bus, "gw-1", epochs, nodes={"n001", "gone"})
    assert {n: [f.id for f in s.commands] for n, s in done.sends.items()} == {"n001": [ids["n001"]]}
    assert done.next_due_ms is None  # only a pass over every node says when the next not_before falls due
    assert (await state(store, ids["n000"]))["state"] == "pending"
    assert (await dispatch_gateway(store, bus, "gw-1", epochs, nodes=set())).sends == {}
    done = await dispatch_gateway(store, bus, "gw-1", epochs)
    assert sorted(done.sends) == ["n000", "n002"]


async def test_a_lane_out_of_credit_does_not_hold_back_another_lane_behind_a_long_backlog(
    store: Store, bus: Bus, add_node: AddNode, put: Enqueue
) -> None:
    epochs = await fleet(store, add_node, 1)
    backlog = [str((await put("n000"))["id"]) for _ in range(40)]  # control: far past its 8 credits
    bulk = str((await put("n000", "logs.collect"))["id"])  # behind all of them, in the bulk lane
    done = await dispatch_gateway(store, bus, "gw-1", epochs, page=5)
    sent = [f.id for f in done.sends["n000"].commands]
    assert sent == [*backlog[: kinds.GATEWAY_CREDITS["control"]], bulk]
    done = await dispatch_gateway(store, bus, "gw-1", epochs)
    assert done.sends == {}  # every control credit is in use: nothing overtakes the ninth


async def test_the_guards_cancel_instead_of_sending(
    store: Store, bus: Bus, add_node: AddNode, put: Enqueue, events: Events
) -> None:
    epochs = await fleet(store, add_node, 2)
    await add_node("bmc")
    epochs["bmc"] = await route(store, "bmc")
    reset = str((await put("n001", "gpu.reset"))["id"])  # destructive on a tenant-controlled node
    refresh = str((await put("bmc", "inventory.refresh"))["id"])  # a kind its role (changed below) may not run
    async with store.transaction() as tx:
        labels = json.dumps({"bc.dev/tenant-controlled": "true"})
        await tx.execute("UPDATE nodes SET labels = :l WHERE node_id = 'n001'", {"l": labels})
        await tx.execute("UPDATE nodes SET role = 'bmc' WHERE node_id = 'bmc'")
    ok = str((await put("n000"))["id"])
    async with store.transaction() as tx:  # a BUSY requeue of a command whose cancel was requested
        await tx.execute("UPDATE commands SET cancel_requested_at_ms = 1 WHERE id = :id", {"id": ok})

    done = await dispatch_gateway(store, bus, "gw-1", epochs)
    assert done.sends == {}
    reasons = {r: (await state(store, r))["reason"] for r in (reset, refresh, ok)}
    assert reasons == {reset: "tenant-controlled", refresh: "kind-not-allowed", ok: "cancelled"}
    settled = {e["subject"] for e in await events("command.settled")}
    assert {reset, refresh, ok} <= settled


async def test_a_cancel_goes_out_once_per_session(store: Store, bus: Bus, add_node: AddNode, put: Enqueue) -> None:
    epochs = await fleet(store, add_node, 1)
    cid = str((await put("n000"))["id"])
    assert [f.id for f in (await dispatch_gateway(store, bus, "gw-1", epochs)).sends["n000"].commands] == [cid]
    await request_cancel(store, bus, cid, "operator")

    done = await dispatch_gateway(store, bus, "gw-1", epochs)
    assert done.sends["n000"].cancels == [(cid, "operator")] and done.sends["n000"].commands == []
    assert (await dispatch_gateway(store, bus, "gw-1", epochs)).sends == {}
    epochs["n000"] = await route(store, "n000")  # a new session: the cancel goes out again
    assert (await dispatch_gateway(store, bus, "gw-1", epochs)).sends["n000"].cancels == [(cid, "operator")]


# -- PostgreSQL: two processes ------------------------------------------------------------------------------


async def _second(store: Store) -> PostgresStore:
    if not isinstance(store, PostgresStore):
        pytest.skip("row locks across processes: PostgreSQL only (SQLite has one writer)")
    other = PostgresStore(store.url, store.clock, schema=store.schema, db_clock=False)
    await other.open(migrate=False)
    return other


async def test_a_command_another_transaction_holds_is_skipped_not_waited_for(
    store: Store, bus: Bus, add_node: AddNode, put: Enqueue
) -> None:
    epochs = await fleet(store, add_node, 3)
    ids = [str((await put(n))["id"]) for n in epochs]
    other = await _second(store)
    try:
        async with other.transaction() as tx:
            await tx.fetchall("SELECT id FROM commands WHERE id = :id FOR UPDATE", {"id": ids[1]})
            done = await dispatch_gateway(store, bus, "gw-1", epochs)  # does not block on the locked row
            assert sorted(done.sends) == ["n000", "n002"]
        done = await dispatch_gateway(store, bus, "gw-1", epochs)
        assert [f.id for f in done.sends["n001"].commands] == [ids[1]]
    finally:
        await other.close()


async def _waiting_on_a_lock(store: Store) -> bool:
    """Whether the lane-heads query of a dispatch pass waits on a row lock. A transaction per look: within one,
    pg_stat_activity's query texts are a snapshot taken at its first read (its wait events are live), so a
    pass seen running an earlier statement would never show the one that waits. Matched by the query's head:
    only its first 1,024 bytes are kept (track_activity_query_size), which may leave out the `FOR SHARE OF s`
    at its end."""
    async with store.transaction(write=False) as tx:
        return bool(
            await tx.fetchval(
                "SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()"
                " AND query LIKE 'SELECT c.*, s.session_epoch FROM node_sessions s JOIN unnest(%'"
            )
        )


async def test_a_pass_waits_for_an_epoch_bump_in_flight_and_then_sends_nothing_there(
    store: Store, bus: Bus, add_node: AddNode, put: Enqueue
) -> None:
    """The session row is share-locked: a Hello elsewhere that has bumped the epoch but not committed makes the
    pass wait, then the row it re-reads routes the node to gw-2, so gw-1 marks nothing on the old epoch."""
    epochs = await fleet(store, add_node, 2)
    ids = [str((await put(n))["id"]) for n in epochs]
    other = await _second(store)
    try:
        async with other.transaction() as tx:
            await tx.execute(
                "UPDATE node_sessions SET gateway_id = 'gw-2', session_epoch = session_epoch + 1 WHERE node_id = 'n001'"
            )
            pass_ = asyncio.ensure_future(dispatch_gateway(store, bus, "gw-1", epochs))
            async with asyncio.timeout(30):
                while not await _waiting_on_a_lock(other):
                    await asyncio.sleep(0.01)
        done = await pass_
        assert sorted(done.sends) == ["n000"]
        assert (await state(store, ids[1]))["state"] == "pending"
    finally:
        await other.close()


async def test_two_gateways_passing_at_once_never_send_one_command_twice(
    store: Store, bus: Bus, add_node: AddNode, put: Enqueue
) -> None:
    a = await fleet(store, add_node, 6)
    b = {n: await route(store, n, "gw-2") for n in list(a)[::2]}  # half the fleet re-homed to gw-2
    for n in a:
        for _ in range(3):
            await put(n)
    other = await _second(store)
    try:
        done_a, done_b = await asyncio.gather(
            dispatch_gateway(store, bus, "gw-1", a, page=2), dispatch_gateway(other, bus, "gw-2", b, page=2)
        )
    finally:
        await other.close()
    sent_a = {f.id for s in done_a.sends.values() for f in s.commands}
    sent_b = {f.id for s in done_b.sends.values() for f in s.commands}
    assert not sent_a & sent_b
    assert len(sent_a | sent_b) == 18
    assert set(done_b.sends) == set(b) and set(done_a.sends) == set(a) - set(b)


# -- the gateway's loop (bc.gateway.dispatcher) -------------------------------------------------------------


async def test_a_burst_of_pokes_is_one_pass_and_the_loop_ends_with_the_last_session(
    store: Store, bus: Bus, clock: LoopClock, add_node: AddNode, put: Enqueue
) -> None:
    epochs = await fleet(store, add_node, 30)
    ids = {n: str((await put(n))["id"]) for n in epochs}
    got: dict[str, SessionSends] = {}
    all_in = asyncio.Event()
    loops: list[asyncio.Future[None]] = []
    fenced = False

    def deliver(node_id: str, sends: SessionSends) -> None:
        got[node_id] = sends
        if len(got) == len(epochs):
            all_in.set()

    d = Dispatcher(
        store,
        bus,
        clock,
        "gw-1",
        lambda only: {n: e for n, e in epochs.items() if only is None or n in only},
        deliver,
        lambda: fenced,
        loops.append,
    )
    for _ in range(len(epochs)):  # one poke per enqueue, as the bus delivers them
        d.poke()
    async with asyncio.timeout(5):
        await all_in.wait()
    assert (d.passes, d.transactions) == (1, 1)
    assert {n: [f.id for f in s.commands] for n, s in got.items()} == {n: [ids[n]] for n in epochs}
    assert len(loops) == 1

    fenced = True  # a fenced gateway makes no pass, whatever wakes it
    late = str((await put("n000"))["id"])
    d.poke()
    await advance(3.0)
    assert d.passes == 1 and (await state(store, late))["state"] == "pending"

    epochs.clear()  # the last session is gone: the loop ends
    d.poke()
    async with asyncio.timeout(5):
        await loops[0]


async def test_every_lane_of_every_node_is_read_across_statements(
    store: Store, bus: Bus, add_node: AddNode, put: Enqueue
) -> None:
    # Seven nodes with work in all three lanes: 21 lane heads, more than one SQLite statement reads
    # (`dispatch._HEADS_PER_SQLITE_STATEMENT`); each node still gets every lane's head, lanes in credit order.
    epochs = await fleet(store, add_node, 7)
    want = {}
    for node_id in epochs:
        control = [str((await put(node_id))["id"]) for _ in range(2)]
        provision = [str((await put(node_id, "diag.dcgm"))["id"])]
        bulk = [str((await put(node_id, "logs.collect"))["id"]) for _ in range(3)]
        want[node_id] = control + provision + bulk[: kinds.GATEWAY_CREDITS["bulk"]]

    done = await dispatch_gateway(store, bus, "gw-1", epochs)

    assert {n: [f.id for f in s.commands] for n, s in done.sends.items()} == want


async def test_on_postgres_a_pass_runs_the_same_statements_whatever_the_number_of_nodes(
    store: Store, bus: Bus, add_node: AddNode, put: Enqueue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The node ids, lane wants and command ids go as array parameters, not as one parameter each: a pass over
    one poked node and one over three send the same statement texts, so each is prepared once per connection
    (a text per list length filled psycopg's prepared-statement cache and paid a PREPARE round trip each)."""
    if not isinstance(store, PostgresStore):
        pytest.skip("statement texts and prepared statements: PostgreSQL only")
    seen: list[str] = []
    run = postgres._run

    async def recording(
        conn: psycopg.AsyncConnection[Row], sql: str, params: Params | None
    ) -> psycopg.AsyncCursor[Row]:
        if "node_sessions" in sql:
            seen.append(sql)
        return await run(conn, sql, params)

    epochs = await fleet(store, add_node, 6)
    monkeypatch.setattr(postgres, "_run", recording)
    texts = []
    for some in (["n000"], ["n001", "n002", "n003"], ["n004", "n005"]):
        for node_id in some:
            await put(node_id)
        seen.clear()
        done = await dispatch_gateway(store, bus, "gw-1", epochs, nodes=set(some))
        assert sorted(done.sends) == some
        texts.append(list(seen))
    assert texts[0] == texts[1] == texts[2]
    assert len(texts[0]) == 7  # has work, in flight, lane heads, cancelled, roles, the mark, cancels to send
