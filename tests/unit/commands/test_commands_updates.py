"""A node's updates, dispatch fencing and cancel: scoped to the node, forward only, results kept byte for byte."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable

import pytest

from bc.control.base.bus import Bus
from bc.control.commands import states as cs
from bc.control.commands.queue import UpdateOutcome, apply_update, request_cancel
from bc.control.reads import views
from bc.control.signing.signer import NullSigner
from bc.errors import NotFound
from bc.protocol.pb import session_pb2 as pb
from bc.seams.clock import LoopClock
from bc.store import Row, Tx
from bc.store import commands as cmd_sql
from bc.store import nodes as nodes_sql
from bc.store.group_commit import GroupCommit
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


async def open_session(store: InlineSqliteStore, node_id: str = "n1") -> int:
    now_ms = await store.now_ms()
    async with store.transaction() as tx:
        opened = await nodes_sql.open_session(
            tx,
            node_id=node_id,
            gateway_id="gw-1",
            journal_id="j1",
            boot_id="boot-1",
            incarnation_id="inc-1",
            cert_serial="serial-1",
            now_ms=now_ms,
        )
    return opened.epoch


async def dispatch(store: InlineSqliteStore, cid: str, epoch: int, node_id: str = "n1") -> bool:
    now_ms = await store.now_ms()
    async with store.transaction() as tx:
        return await cmd_sql.mark_dispatched(tx, cid, node_id, epoch, now_ms)


async def report(store: InlineSqliteStore, bus: Bus, node_id: str, cid: str, state: int, **kw: object) -> UpdateOutcome:
    now_ms = await store.now_ms()
    update = pb.CommandUpdate(command_id=cid, state=state, **kw)  # type: ignore[arg-type]
    async with store.transaction() as tx:
        return await apply_update(tx, bus, NullSigner(), node_id, update, now_ms)  # attestation: see test_intent


@pytest.fixture
async def sent(store: InlineSqliteStore, add_node: AddNode, put: Enqueue) -> Row:
    """An inventory.refresh on n1, dispatched on n1's open session."""
    await add_node("n1")
    await add_node("n2")
    row = await put("n1")
    assert await dispatch(store, str(row["id"]), await open_session(store))
    return await get(store, str(row["id"]))


# -- dispatch ---------------------------------------------------------------------------


async def test_dispatch_is_fenced_by_state_and_session_epoch(
    store: InlineSqliteStore, add_node: AddNode, put: Enqueue
) -> None:
    await add_node("n1")
    a, b = await put("n1"), await put("n1")
    async with store.transaction(write=False) as tx:
        assert [r["id"] for r in await cmd_sql.pending_for_node(tx, "n1", await store.now_ms())] == [a["id"], b["id"]]
    assert not await dispatch(store, str(a["id"]), 1)  # no session yet
    epoch = await open_session(store)
    assert not await dispatch(store, str(a["id"]), epoch + 1)  # not the node's session
    assert await dispatch(store, str(a["id"]), epoch)
    assert not await dispatch(store, str(a["id"]), epoch)  # no longer pending
    row = await get(store, str(a["id"]))
    assert (row["state"], row["dispatched_epoch"], row["attempt"]) == ("dispatched", epoch, 1)
    async with store.transaction(write=False) as tx:
        assert [r["id"] for r in await cmd_sql.in_flight_for_node(tx, "n1")] == [a["id"]]
        assert [r["id"] for r in await cmd_sql.pending_for_node(tx, "n1", await store.now_ms())] == [b["id"]]


async def test_a_pending_command_past_not_after_is_not_dispatchable(
    store: InlineSqliteStore, clock: LoopClock, add_node: AddNode, put: Enqueue
) -> None:
    await add_node("n1")
    await put("n1", not_after_s=10)
    await advance(10)
    async with store.transaction(write=False) as tx:
        assert await cmd_sql.pending_for_node(tx, "n1", await store.now_ms()) == []


# -- updates ----------------------------------------------------------------------------


async def test_updates_move_the_command_forward_and_publish(
    store: InlineSqliteStore, bus: Bus, sent: Row, events: Events
) -> None:
    cid = str(sent["id"])
    assert await report(store, bus, "n1", cid, pb.COMMAND_ACKED, boot_id="boot-1") == UpdateOutcome(
        known=True, changed=True, terminal=False, state="acked"
    )
    assert await report(store, bus, "n1", cid, pb.COMMAND_RUNNING, boot_id="boot-1") == UpdateOutcome(
        True, True, False, "running"
    )
    out = await report(store, bus, "n1", cid, pb.COMMAND_SUCCEEDED, result=b'{"ok":true}', boot_id="boot-1")
    assert out == UpdateOutcome(True, True, True, "succeeded")
    assert [json.loads(e["data"])["state"] for e in await events("command.updated")] == ["acked", "running"]
    [settled] = await events("command.settled")
    assert settled["subject"] == cid
    assert json.loads(settled["data"]) == {
        "node_id": "n1",
        "kind": "inventory.refresh",
        "state": "succeeded",
        "reason": "",
    }
    row = await get(store, cid)
    assert row["settled_at_ms"] == await store.now_ms()


async def test_terminal_results_are_stored_exactly_as_received(store: InlineSqliteStore, bus: Bus, sent: Row) -> None:
    cid = str(sent["id"])
    result = b'{"z": 1,  "a": [3, 2]}'  # not canonical on purpose: nothing may re-encode it
    sig = bytes(range(256))
    out = await report(
        store,
        bus,
        "n1",
        cid,
        pb.COMMAND_FAILED,
        reason="nvml-error",
        message="NVML_ERROR_GPU_IS_LOST on GPU-3",
        result=result,
        node_sig=sig,
        boot_id="boot-7",
    )
    assert out.terminal and out.state == "failed"
    row = await get(store, cid)
    assert bytes(row["result"]) == result and bytes(row["node_sig"]) == sig
    assert (row["reason"], row["message"], row["boot_id"]) == (
        "nvml-error",
        "NVML_ERROR_GPU_IS_LOST on GPU-3",
        "boot-7",
    )
    info = views.command_info(row, await store.now_ms())
    assert info.result_json == result.decode()  # shown as the node sent it, not re-serialized


async def test_another_nodes_update_changes_nothing(
    store: InlineSqliteStore, bus: Bus, sent: Row, events: Events
) -> None:
    cid = str(sent["id"])
    out = await report(store, bus, "n2", cid, pb.COMMAND_SUCCEEDED, result=b'{"forged":true}')
    assert out == UpdateOutcome(known=False, changed=False, terminal=False, state="")
    assert await get(store, cid) == sent
    assert await events("command.settled") == []
    [alarm] = await events("security.node-mismatch")
    assert alarm["subject"] == "n2" and json.loads(alarm["data"])["owner"] == "n1"


async def test_an_unknown_id_changes_nothing(store: InlineSqliteStore, bus: Bus, sent: Row, events: Events) -> None:
    out = await report(store, bus, "n1", "01NOSUCHCOMMAND", pb.COMMAND_SUCCEEDED)
    assert not out.known and not out.changed
    assert await events("command.settled") == [] and await events("security.") == []


async def test_stale_and_repeated_updates_change_nothing(
    store: InlineSqliteStore, bus: Bus, sent: Row, events: Events
) -> None:
    cid = str(sent["id"])
    await report(store, bus, "n1", cid, pb.COMMAND_RUNNING, boot_id="b1")
    before = await get(store, cid)
    assert await report(store, bus, "n1", cid, pb.COMMAND_ACKED) == UpdateOutcome(True, False, False, "running")
    assert await report(store, bus, "n1", cid, pb.COMMAND_RUNNING) == UpdateOutcome(True, False, False, "running")
    assert await get(store, cid) == before
    await report(store, bus, "n1", cid, pb.COMMAND_SUCCEEDED, result=b'{"n":1}')
    settled = await get(store, cid)
    # A repeated result, or a different late one, is acknowledged (terminal) but changes nothing.
    assert await report(store, bus, "n1", cid, pb.COMMAND_SUCCEEDED, result=b'{"n":1}') == UpdateOutcome(
        True, False, True, "succeeded"
    )
    assert await report(store, bus, "n1", cid, pb.COMMAND_FAILED, reason="late") == UpdateOutcome(
        True, False, True, "succeeded"
    )
    assert await get(store, cid) == settled
    assert len(await events("command.settled")) == 1


async def test_a_result_lands_even_when_acked_and_running_were_lost(
    store: InlineSqliteStore, bus: Bus, sent: Row
) -> None:
    out = await report(store, bus, "n1", str(sent["id"]), pb.COMMAND_REJECTED, reason="STALE_GENERATION")
    assert out == UpdateOutcome(True, True, True, "rejected")


def test_a_result_that_is_not_json_is_shown_as_base64() -> None:
    assert views.result_text(b"\xff\x00raw") == "/wByYXc="
    assert views.result_text(b"") == "" and views.result_text(None) == ""
    assert views.result_text(b"not json") == "bm90IGpzb24="


# -- cancel -----------------------------------------------------------------------------


async def test_cancel_before_dispatch_wins(
    store: InlineSqliteStore, bus: Bus, pokes: list[str], add_node: AddNode, put: Enqueue, events: Events
) -> None:
    await add_node("n1")
    row = await put("n1")
    cid = str(row["id"])
    pokes.clear()
    out = await request_cancel(store, bus, cid, "wrong node")
    assert (out["state"], out["reason"], out["message"]) == ("cancelled", "cancelled", "wrong node")
    assert out["settled_at_ms"] is not None
    [settled] = await events("command.settled")
    assert json.loads(settled["data"])["state"] == "cancelled"
    # Never sent: not dispatchable, and a dispatch attempt matches nothing.
    epoch = await open_session(store)
    async with store.transaction(write=False) as tx:
        assert await cmd_sql.pending_for_node(tx, "n1", await store.now_ms()) == []
    assert not await dispatch(store, cid, epoch)
    # A late report from the node cannot revive it.
    assert (await report(store, bus, "n1", cid, pb.COMMAND_SUCCEEDED)).state == "cancelled"


async def test_cancel_in_flight_flags_it_and_pokes_the_gateway(
    store: InlineSqliteStore, bus: Bus, pokes: list[str], sent: Row, events: Events
) -> None:
    cid = str(sent["id"])
    pokes.clear()
    out = await request_cancel(store, bus, cid, "")
    assert out["state"] == "dispatched" and out["cancel_requested_at_ms"] is not None
    assert out["cancel_reason"] == "cancelled by the operator"
    assert pokes == ["n1"]
    assert len(await events("command.cancel-requested")) == 1
    assert views.command_info(out, await store.now_ms()).cancel_requested

    # The gateway sends Cancel once per session...
    epoch = int(sent["dispatched_epoch"])
    async with store.transaction() as tx:
        assert [r["id"] for r in await cmd_sql.cancels_to_send(tx, "n1", epoch)] == [cid]
        assert await cmd_sql.mark_cancel_sent(tx, cid, "n1", epoch)
        assert await cmd_sql.cancels_to_send(tx, "n1", epoch) == []
    # ...and again after a reconnect.
    new_epoch = await open_session(store)
    async with store.transaction() as tx:
        assert [r["id"] for r in await cmd_sql.cancels_to_send(tx, "n1", new_epoch)] == [cid]

    # Asking again changes nothing; a real outcome still wins over the cancel.
    again = await request_cancel(store, bus, cid, "twice")
    assert again["cancel_reason"] == "cancelled by the operator"
    assert (await report(store, bus, "n1", cid, pb.COMMAND_SUCCEEDED)).state == "succeeded"


async def test_cancel_of_a_settled_command_returns_it_unchanged(
    store: InlineSqliteStore, bus: Bus, pokes: list[str], sent: Row, events: Events
) -> None:
    cid = str(sent["id"])
    await report(store, bus, "n1", cid, pb.COMMAND_SUCCEEDED, result=b"{}")
    before = await get(store, cid)
    pokes.clear()
    assert await request_cancel(store, bus, cid, "too late") == before
    assert pokes == [] and await events("command.cancel-requested") == []


async def test_cancel_of_an_unknown_command_is_not_found(store: InlineSqliteStore, bus: Bus) -> None:
    with pytest.raises(NotFound, match="no command 'nope'"):
        await request_cancel(store, bus, "nope", "")


async def test_results_one_batch_committed_whose_acks_a_crash_lost_settle_once_and_are_acked_when_resent(
    store: InlineSqliteStore, bus: Bus, add_node: AddNode, put: Enqueue, events: Events
) -> None:
    """Group commit answers (and the gateway acks) only after the commit. A gateway that dies between the two
    leaves the node holding results the store already has: resent to the next gateway process, each is
    terminal (so acked) and changes nothing: one settle per command, the first result kept."""
    await add_node("n1")
    epoch = await open_session(store)
    cids = [str((await put("n1"))["id"]) for _ in range(6)]
    for cid in cids:
        assert await dispatch(store, cid, epoch)
    now_ms = await store.now_ms()

    def deliver(group: GroupCommit, on: Bus, result: bytes) -> list[Awaitable[UpdateOutcome]]:
        def work(cid: str) -> Callable[[Tx], Awaitable[UpdateOutcome]]:
            update = pb.CommandUpdate(command_id=cid, state=pb.COMMAND_SUCCEEDED, result=result)
            return lambda tx: apply_update(tx, on, NullSigner(), "n1", update, now_ms)

        return [group.run(work(cid)) for cid in cids]

    group = GroupCommit(store)
    first = await asyncio.gather(*deliver(group, bus, b'{"run":1}'))
    assert all(o.changed and o.terminal for o in first)
    assert group.stats.members >= 2, "the results did not share a transaction"
    # The crash: the answers (and with them the acks) are lost with the process's memory; the store keeps
    # what committed. The node resends every unacked result to the gateway process that comes up next.
    restarted = GroupCommit(store)
    again = await asyncio.gather(*deliver(restarted, Bus(), b'{"run":2}'))
    assert again == [UpdateOutcome(known=True, changed=False, terminal=True, state="succeeded")] * len(cids)
    assert sorted(str(e["subject"]) for e in await events("command.settled")) == sorted(cids)
    for cid in cids:
        assert bytes((await get(store, cid))["result"]) == b'{"run":1}'


async def test_every_report_from_every_state_moves_the_command_as_the_state_table_says(
    store: InlineSqliteStore, bus: Bus, add_node: AddNode, put: Enqueue, events: Events
) -> None:
    # A report is applied by one UPDATE from the state it comes after in order (`commands._report_at_once`),
    # and read first otherwise: from every state, the outcome, the row and the events are the state table's.
    await add_node("n1")
    for current in cs.STATES:
        for report_state, name in cs.UPDATE_STATES.items():
            cid = str((await put("n1"))["id"])
            now_ms = await store.now_ms()
            async with store.transaction() as tx:
                if cs.is_terminal(current):
                    assert await cmd_sql.settle(
                        tx, cid, expected="pending", state=current, reason="", message="", now_ms=now_ms
                    )
                elif current != cs.PENDING:
                    assert await cmd_sql.advance(
                        tx, cid, "n1", expected="pending", state=current, boot_id="", now_ms=now_ms
                    )
            seen = len(await events("command."))
            out = await report(store, bus, "n1", cid, report_state, result=b"{}", boot_id="boot-1")
            target = cs.next_state(current, report_state)
            row = await get(store, cid)
            if target is None:
                assert out == UpdateOutcome(True, False, cs.is_terminal(current), current), (current, name)
                assert row["state"] == current
                assert len(await events("command.")) == seen
            else:
                assert out == UpdateOutcome(True, True, cs.is_terminal(target), target), (current, name)
                assert (row["state"], row["boot_id"]) == (target, "boot-1")
                assert (row["settled_at_ms"] is not None, row["result"]) == (
                    (True, b"{}") if cs.is_terminal(target) else (False, None)
                )
                [last] = (await events("command."))[seen:]
                assert (last["type"], last["subject"]) == (
                    "command.settled" if cs.is_terminal(target) else "command.updated",
                    cid,
                )
