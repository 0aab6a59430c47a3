"""The CommandSweeper: expired pending commands, timed-out in-flight ones, one sweeper at a time."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable

from bc.control.base.bus import Bus
from bc.control.commands.sweeper import LEASE_NAME, CommandSweeper
from bc.seams.clock import LoopClock
from bc.store import Row
from bc.store import commands as cmd_sql
from bc.store import nodes as nodes_sql
from bc.store.sqlite import InlineSqliteStore
from bc.testing import advance

AddNode = Callable[..., Awaitable[None]]
Enqueue = Callable[..., Awaitable[Row]]
Events = Callable[[str], Awaitable[list[Row]]]


async def get(store: InlineSqliteStore, cid: str) -> Row:
    async with store.transaction(write=False) as tx:
        row = await cmd_sql.get(tx, cid)
    assert row is not None
    return row


async def send(store: InlineSqliteStore, cid: str, node_id: str = "n1") -> None:
    """Dispatch on a fresh session of the node."""
    now_ms = await store.now_ms()
    async with store.transaction() as tx:
        opened = await nodes_sql.open_session(
            tx,
            node_id=node_id,
            gateway_id="gw-1",
            journal_id="j1",
            boot_id="b1",
            incarnation_id="i1",
            cert_serial="s1",
            now_ms=now_ms,
        )
        assert await cmd_sql.mark_dispatched(tx, cid, node_id, opened.epoch, now_ms)


async def test_a_pending_command_past_not_after_expires(
    store: InlineSqliteStore, bus: Bus, clock: LoopClock, add_node: AddNode, put: Enqueue, events: Events
) -> None:
    await add_node("n1")
    cid = str((await put("n1", not_after_s=30))["id"])
    sweeper = CommandSweeper(store, bus, "gw-1")
    await advance(29)
    assert await sweeper.sweep_once() == []
    await advance(1)
    assert await sweeper.sweep_once() == [(cid, "expired")]
    row = await get(store, cid)
    assert (row["state"], row["reason"]) == ("expired", "expired")
    [ev] = await events("command.settled")
    assert ev["subject"] == cid
    assert json.loads(ev["data"]) == {
        "node_id": "n1",
        "kind": "inventory.refresh",
        "state": "expired",
        "reason": "expired",
    }
    assert await sweeper.sweep_once() == []  # once


async def test_an_in_flight_command_fails_timeout_after_its_kinds_timeout(
    store: InlineSqliteStore,
    bus: Bus,
    pokes: list[str],
    clock: LoopClock,
    add_node: AddNode,
    put: Enqueue,
    events: Events,
) -> None:
    await add_node("n1")
    inv = str((await put("n1", "inventory.refresh", not_after_s=60))["id"])  # 2 min timeout
    reboot = str((await put("n1", "node.reboot", not_after_s=60))["id"])  # 15 min timeout
    await send(store, inv)
    await send(store, reboot)
    sweeper = CommandSweeper(store, bus, "gw-1")
    await advance(60 + 119)
    assert await sweeper.sweep_once() == []  # past not_after, not past the timeout: in-flight is not expired
    await advance(1)
    pokes.clear()
    assert await sweeper.sweep_once() == [(inv, "failed")]
    row = await get(store, inv)
    assert (row["state"], row["reason"]) == ("failed", "timeout")
    assert "last state dispatched" in row["message"]
    assert pokes == ["n1"]  # the gateway frees the lane's credit
    assert (await get(store, reboot))["state"] == "dispatched"
    await advance(13 * 60)
    assert await sweeper.sweep_once() == [(reboot, "failed")]
    assert [json.loads(e["data"])["reason"] for e in await events("command.settled")] == ["timeout", "timeout"]


async def test_settled_commands_are_left_alone(
    store: InlineSqliteStore, bus: Bus, clock: LoopClock, add_node: AddNode, put: Enqueue
) -> None:
    await add_node("n1")
    cid = str((await put("n1", not_after_s=5))["id"])
    await send(store, cid)
    async with store.transaction() as tx:
        assert await cmd_sql.settle(
            tx, cid, expected="dispatched", state="succeeded", reason="", message="", now_ms=await store.now_ms()
        )
    await advance(3600)
    assert await CommandSweeper(store, bus, "gw-1").sweep_once() == []
    assert (await get(store, cid))["state"] == "succeeded"


async def test_one_sweeper_at_a_time_under_the_lease(
    store: InlineSqliteStore, bus: Bus, clock: LoopClock, add_node: AddNode, put: Enqueue
) -> None:
    await add_node("n1")
    a, b = CommandSweeper(store, bus, "proc-a"), CommandSweeper(store, bus, "proc-b")
    first = str((await put("n1", not_after_s=1))["id"])
    await advance(1)
    assert await a.sweep_once() == [(first, "expired")]
    second = str((await put("n1", not_after_s=1))["id"])
    await advance(1)
    assert await b.sweep_once() == []  # a holds the lease
    assert (await get(store, second))["state"] == "pending"
    assert await a.sweep_once() == [(second, "expired")]  # a renews it
    third = str((await put("n1", not_after_s=1))["id"])
    await advance(16)  # a has stopped sweeping; its 15 s lease runs out
    assert await b.sweep_once() == [(third, "expired")]
    async with store.transaction(write=False) as tx:
        assert await tx.fetchval("SELECT holder FROM leases WHERE name = :n", {"n": LEASE_NAME}) == "proc-b"
    assert await a.sweep_once() == []


async def test_run_forever_sweeps_on_the_injected_clock(
    store: InlineSqliteStore, bus: Bus, clock: LoopClock, add_node: AddNode, put: Enqueue
) -> None:
    await add_node("n1")
    cid = str((await put("n1", not_after_s=12))["id"])
    task = asyncio.create_task(CommandSweeper(store, bus, "gw-1").run_forever(clock))  # a pass every 5 s
    try:
        await advance(11)  # passes at 0, 5 and 10 s: not yet past not_after
        assert (await get(store, cid))["state"] == "pending"
        await advance(5)  # the pass at 15 s
        assert (await get(store, cid))["state"] == "expired"
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
