"""The production gateway under a reconnect storm (`bc.gateway.admission`): Hellos beyond the bound wait for a
slot, and a refused one carries a retry-after the production agent honours. SessionPair on virtual time."""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path
from typing import Any

import pytest

from bc.gateway import session_driver
from bc.gateway.admission import Admission, Turn
from bc.gateway.hello import HelloResult
from bc.gateway.sessions import Gateway
from bc.sim.pair import SessionPair
from bc.store import events as events_sql

RETRY_AFTER_S = 7.3
HELLO_S = 1.0


class RefuseTwice(Admission):
    """The first two Hellos refused, each told to come back in 7.3 s."""

    def __init__(self, now: float) -> None:
        super().__init__(refilled_at=now)
        self.to_refuse = 2

    def hello(self, now: float) -> Turn:
        if self.to_refuse:
            self.to_refuse -= 1
            self.refused += 1
            return Turn.REFUSE
        return super().hello(now)

    def retry_after(self, now: float, rng: random.Random) -> float:
        return RETRY_AFTER_S


async def connected_at(pair: SessionPair, node_id: str) -> list[float]:
    async with pair.store.transaction(write=False) as tx:
        rows = await events_sql.list_events(tx, 0, 10_000, "node.connectivity")
    return [
        int(r["at_ms"]) / 1000
        for r in rows
        if r["subject"] == node_id and json.loads(str(r["data"]))["state"] == "connected"
    ]


def gateway(pair: SessionPair) -> Gateway:
    assert pair.network.gateway is not None
    return pair.network.gateway


async def test_a_refused_node_comes_back_after_the_retry_after_it_was_told(tmp_path: Path) -> None:
    pair = SessionPair(tmp_path, seed=4, agents=1)
    await pair.start()
    try:
        await asyncio.sleep(5)
        assert len(await connected_at(pair, "n000")) == 1
        await pair.crash_agent("n000")
        gw = gateway(pair)
        gw.admission = RefuseTwice(gw.clock.monotonic())
        refused_before = gw.counters.streams_refused
        dials_before = pair.network.dials["n000"]
        started = pair.clock.now()
        pair.start_agent("n000")
        await asyncio.sleep(60)
        back = (await connected_at(pair, "n000"))[1:]
    finally:
        await pair.stop()
    assert gw.counters.streams_refused - refused_before == 2
    assert pair.network.dials["n000"] - dials_before == 3  # refused, refused, welcomed: no other dial
    # Two refusals, each followed by exactly the wait it named (no back-off drawn on top), then the Hello.
    assert len(back) == 1 and 2 * RETRY_AFTER_S - 0.01 <= back[0] - started <= 2 * RETRY_AFTER_S + 0.5


async def test_hellos_beyond_the_bound_wait_for_a_slot_instead_of_being_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = session_driver.hello_in

    async def slow_hello(*args: Any) -> HelloResult:
        await asyncio.sleep(HELLO_S)  # a Hello transaction that takes its time, as on a busy PostgreSQL
        return await real(*args)

    monkeypatch.setattr(session_driver, "hello_in", slow_hello)
    pair = SessionPair(tmp_path, seed=5, agents=6)
    await pair.start()
    try:
        await asyncio.sleep(5)
        gw = gateway(pair)
        for node_id in pair.node_ids():
            await pair.crash_agent(node_id)
        await asyncio.sleep(1)
        gw.admission = Admission(refilled_at=gw.clock.monotonic(), max_pending=1)  # one Hello at a time
        for node_id in pair.node_ids():
            pair.start_agent(node_id)
        started = pair.clock.now()
        await asyncio.sleep(30)
        states = await pair.connectivity()
        back = [(await connected_at(pair, n))[-1] - started for n in pair.node_ids()]
    finally:
        await pair.stop()
    assert set(states.values()) == {"connected"}
    assert gw.counters.streams_refused == 0 and gw.counters.hellos_waited == 5
    # One after the other, each starting (its event is stamped with the time it started) as soon as the one
    # before it ended: six Hellos, the last starting five Hello-times after the first.
    assert sorted(round(t / HELLO_S) for t in back) == [0, 1, 2, 3, 4, 5]
    assert (gw.admission.pending, gw.admission.waiting) == (0, 0)  # every slot handed back
