"""Hellos in the gateway's group commit (`SessionDriver._hello`): a storm's Hellos share transactions, and a
stream that ends while its Hello waits or commits leaves no node routed to a session nobody holds. And the
new streams' revocation check (`Gateway.refuse_revoked`): one read for the streams of one turn.
SessionPair on virtual time; the gateway's session task is cancelled as gRPC cancels a handler whose
client hung up."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from bc.gateway import session_driver
from bc.gateway.hello import HelloResult
from bc.protocol.closing import SessionRefused
from bc.sim.pair import SessionPair
from bc.store import Tx
from bc.store import events as events_sql
from bc.store import revocation as rev_sql
from tests.unit.gateway.test_hello_queue import connected_at, gateway


async def until(cond: Callable[[], bool], timeout_s: float = 60.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not cond():
            await asyncio.sleep(0.01)


async def connectivity_events(pair: SessionPair, node_id: str) -> list[tuple[str, int]]:
    async with pair.store.transaction(write=False) as tx:
        rows = await events_sql.list_events(tx, 0, 10_000, "node.connectivity")
    return [
        (d["state"], int(d["epoch"]))
        for r in rows
        if r["subject"] == node_id and (d := json.loads(str(r["data"])))["state"] in ("connected", "disconnected")
    ]


def hold_group(pair: SessionPair) -> tuple[asyncio.Event, asyncio.Future[None]]:
    """A member that keeps the gateway's group commit busy until the event is set: what queues behind it
    waits for the next batch."""
    release = asyncio.Event()

    async def held(tx: Tx) -> None:
        await release.wait()

    return release, asyncio.ensure_future(gateway(pair).group.run(held))


def session_task(pair: SessionPair, node_id: str) -> asyncio.Task[Any]:
    (task,) = [t for t in pair.network.sessions if t.get_name() == f"session-{node_id}" and not t.done()]
    return task


async def test_the_hellos_of_a_reconnect_storm_share_transactions(tmp_path: Path) -> None:
    pair = SessionPair(tmp_path, seed=11, agents=8)
    await pair.start()
    try:
        await asyncio.sleep(5)
        gw = gateway(pair)
        for node_id in pair.node_ids():
            await pair.crash_agent(node_id)
        await asyncio.sleep(1)
        release, held = hold_group(pair)
        members_before = gw.group.stats.members
        for node_id in pair.node_ids():
            pair.start_agent(node_id)
        await until(lambda: gw.admission.pending == 8)  # every Hello queued behind the held member
        release.set()
        await held
        await asyncio.sleep(5)
        states = await pair.connectivity()
        reconnects = [len(await connected_at(pair, n)) for n in pair.node_ids()]
    finally:
        await pair.stop()
    assert set(states.values()) == {"connected"}
    assert reconnects == [2] * 8  # the first session, then this one: no Hello written twice
    assert gw.group.stats.members - members_before >= 8  # the eight Hellos committed in shared transactions


async def test_a_hello_whose_stream_ended_while_it_waited_is_not_written(tmp_path: Path) -> None:
    pair = SessionPair(tmp_path, seed=12, agents=1)
    await pair.start()
    try:
        await asyncio.sleep(5)
        gw = gateway(pair)
        before = await connectivity_events(pair, "n000")
        await pair.crash_agent("n000")
        await asyncio.sleep(1)
        release, held = hold_group(pair)
        pair.start_agent("n000")
        await until(lambda: gw.admission.pending == 1)
        await pair.crash_agent("n000")  # the node is gone again, and gRPC ends the handler
        task = session_task(pair, "n000")
        task.cancel()
        release.set()
        await held
        await asyncio.gather(task, return_exceptions=True)
        await asyncio.sleep(5)
        after = await connectivity_events(pair, "n000")
        states = await pair.connectivity()
    finally:
        await pair.stop()
    assert before == [("connected", 1)]
    assert after == [("connected", 1), ("disconnected", 1)]  # the queued Hello routed nothing
    assert states["n000"] == "disconnected"
    assert (gw.admission.pending, gw.admission.waiting) == (0, 0)


async def test_a_hello_committed_after_its_stream_ended_is_closed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = session_driver.hello_in
    writing = asyncio.Event()
    go_on = asyncio.Event()
    hold = {"on": False}

    async def slow_hello(*args: Any) -> HelloResult:
        if hold["on"]:
            writing.set()
            await go_on.wait()  # in the batch's transaction: past the check for an ended stream
        return await real(*args)

    monkeypatch.setattr(session_driver, "hello_in", slow_hello)
    pair = SessionPair(tmp_path, seed=13, agents=1)
    await pair.start()
    try:
        await asyncio.sleep(5)
        await pair.crash_agent("n000")
        await asyncio.sleep(1)
        hold["on"] = True
        pair.start_agent("n000")
        await writing.wait()
        await pair.crash_agent("n000")
        task = session_task(pair, "n000")
        task.cancel()
        await asyncio.sleep(0.1)
        go_on.set()
        await asyncio.gather(task, return_exceptions=True)
        await asyncio.sleep(5)
        after = await connectivity_events(pair, "n000")
        states = await pair.connectivity()
    finally:
        await pair.stop()
    # The second Hello committed (epoch 2) after its stream was gone: the session's cleanup closed it.
    assert after == [("connected", 1), ("disconnected", 1), ("connected", 2), ("disconnected", 2)]
    assert states["n000"] == "disconnected"


async def test_the_new_streams_of_a_storm_share_one_revocation_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pair = SessionPair(tmp_path, seed=14, agents=6)
    await pair.start()
    try:
        await asyncio.sleep(5)
        gw = gateway(pair)
        serials = {n: pair.network.peers[n].serial for n in pair.node_ids()}
        async with pair.store.transaction() as tx:
            await rev_sql.revoke_node(tx, "n003", "stolen", await pair.store.now_ms())
        reads: list[list[str]] = []
        real = rev_sql.revoked_among

        async def counted(tx: Tx, asked: list[str]) -> Any:
            reads.append(list(asked))
            return await real(tx, asked)

        monkeypatch.setattr(rev_sql, "revoked_among", counted)
        outcomes = await asyncio.gather(*(gw.refuse_revoked(s) for s in serials.values()), return_exceptions=True)
        again = await asyncio.gather(gw.refuse_revoked(serials["n000"]), return_exceptions=True)
    finally:
        await pair.stop()
    assert reads[0] == sorted(serials.values())  # one read for the six streams that asked together
    refused = {n for n, o in zip(serials, outcomes, strict=True) if isinstance(o, SessionRefused)}
    assert refused == {"n003"} and "stolen" in str(outcomes[3])
    assert [o for o in outcomes if not isinstance(o, SessionRefused)] == [None] * 5
    assert len(reads) == 2 and reads[1] == [serials["n000"]] and again == [None]  # a later stream: a fresh read
