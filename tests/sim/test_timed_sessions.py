"""Timed session behaviour on virtual time over in-memory links: missed heartbeats, liveness, revocation.

The production gateway, control plane and agents (`bc.sim.pair.SessionPair`); time is the virtual
loop's, so the assertions name the very second a transition happens, and an hour takes a blink.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from bc.control.capacity.reservations import ReserveRequest, reserve
from bc.control.nodes import admin as node_admin
from bc.sim.pair import PairConfig, SessionPair
from bc.store import events as events_sql
from bc.store import reservations as res_sql

HEARTBEAT_S = 10.0
LEASE_TTL_S = 40.0


async def transitions(pair: SessionPair, node_id: str, after_seq: int = 0) -> list[tuple[str, float, str]]:
    """(state, virtual seconds since the loop's epoch, reason) of the node's connectivity events."""
    async with pair.store.transaction(write=False) as tx:
        rows = await events_sql.list_events(tx, after_seq, 10_000, "node.connectivity")
    out = []
    for r in rows:
        if r["subject"] == node_id:
            d = json.loads(str(r["data"]))
            out.append((str(d["state"]), int(r["at_ms"]) / 1000, str(d.get("reason", ""))))
    return out


async def started(tmp_path: Path, agents: int = 2) -> SessionPair:
    pair = SessionPair(
        tmp_path, seed=3, agents=agents, cfg=PairConfig(heartbeat_interval_s=HEARTBEAT_S, lease_ttl_s=LEASE_TTL_S)
    )
    await pair.start()
    await asyncio.sleep(5)
    assert set((await pair.connectivity()).values()) == {"connected"}
    return pair


async def test_three_missed_heartbeats_close_the_session_and_the_lease_ttl_makes_it_unreachable(
    tmp_path: Path,
) -> None:
    pair = await started(tmp_path)
    try:
        await asyncio.sleep(3600)  # an hour of heartbeats: nothing changes
        assert await transitions(pair, "n001") == [("connected", (await transitions(pair, "n001"))[0][1], "")]
        cut_at = pair.clock.now()
        pair.partition(["n001"])
        await asyncio.sleep(LEASE_TTL_S + 4 * HEARTBEAT_S)
        seen = await transitions(pair, "n001")
        pair.heal()
        await asyncio.sleep(120)
        back = await transitions(pair, "n001")
        other = await transitions(pair, "n000")
    finally:
        await pair.stop()
    (_, _, _), (gone, gone_at, why), (unreach, unreach_at, _) = seen
    assert gone == "disconnected" and unreach == "unreachable"
    # Silence for three heartbeat intervals closes it (checked on the gateway's 1 s tick), not before; the
    # silence began with the node's last heartbeat, up to one interval before the cut.
    assert 2 * HEARTBEAT_S <= gone_at - cut_at <= 3 * HEARTBEAT_S + 2, (gone_at - cut_at, why)
    assert why == "no frame from the node for 3 heartbeat intervals"
    # Unreachable once it has been disconnected for the lease TTL (liveness sweeps every second).
    assert LEASE_TTL_S <= unreach_at - gone_at <= LEASE_TTL_S + 2
    assert back[-1][0] == "connected" and len(back) == 4  # healed: back after the agent's back-off
    assert [s for s, _, _ in other] == ["connected"]  # the other node never noticed


async def test_a_revoked_node_is_told_within_the_feed_interval_stops_and_keeps_its_hold(tmp_path: Path) -> None:
    pair = await started(tmp_path)
    try:
        assert pair.cp is not None
        held = await reserve(pair.store, pair.cp.bus, pair.cp.signer, ReserveRequest(gpus=1, node_id="n000"), pair.rng)
        await asyncio.sleep(30)
        revoked_at = pair.clock.now()
        await node_admin.revoke(pair.store, pair.cp.bus, "n000", "compromised host")
        async with asyncio.timeout(10):
            await pair.tasks["n000"]  # the agent stops rather than redial
        stopped_at = pair.clock.now()
        dials = pair.network.dials["n000"]
        await asyncio.sleep(3600)
        seen = await transitions(pair, "n000")
        async with pair.store.transaction(write=False) as tx:
            hold = await res_sql.get(tx, str(held["id"]))
        agent = pair.agents["n000"]
        other = await transitions(pair, "n001")
    finally:
        await pair.stop()
    assert stopped_at - revoked_at <= 2  # the feed polls every second
    after = [t for t in seen if t[1] >= revoked_at]
    assert after[0][0] == "disconnected" and after[0][2] == "certificate revoked: compromised host", after
    assert after[0][1] - revoked_at <= 2
    assert [s for s, _, _ in after] == ["disconnected", "unreachable"]  # and it never came back
    assert agent.revoked_reason == "certificate revoked: compromised host"
    assert pair.network.dials["n000"] == dials  # an hour later, not one more dial
    assert hold is not None and hold["state"] == "active"  # revocation releases nothing
    assert [s for s, _, _ in other] == ["connected"]
