"""A gateway that loses its lease stops routing: its streams close UNAVAILABLE, new sessions are refused,
and it routes again once it holds the lease again (reference: "Gateway cut off from PostgreSQL")."""

from __future__ import annotations

import asyncio

import pytest

from bc.errors import Unavailable
from bc.store import leases
from tests.integration.conftest import InprocLab


async def move_lease(lab: InprocLab, to: str) -> None:
    """What another gateway taking over looks like in the store: the lease row names it."""
    name = f"gateway:{lab.server.gateway_id}"
    async with lab.server.store.transaction() as tx:  # type: ignore[union-attr]
        await tx.execute("UPDATE leases SET holder = :h WHERE name = :n", {"h": to, "n": name})


async def test_a_gateway_whose_lease_moved_closes_its_streams_refuses_sessions_then_routes_again(
    lab: InprocLab,
) -> None:
    await lab.join("n1")
    await lab.start_node("n1")
    first = await lab.wait_connected("n1")
    gw = lab.server.gateway

    await move_lease(lab, "gw-elsewhere")
    # The liveness sweep sees the lease gone first and says so; the gateway fences at its next renewal (5 s).
    closed = await lab.wait_event(
        "node.connectivity", lambda ev, d: ev.subject == "n1" and ev.seq > first.seq and d["state"] != "connected"
    )
    async with asyncio.timeout(15):
        while gw.sessions or not gw.fence.fenced:  # in-process state, no event for it: look each 50 ms
            await asyncio.sleep(0.05)
    assert "moved" in gw.fence.why, gw.fence
    with pytest.raises(Unavailable, match="fenced"):  # what a redialing node is told
        gw.admit()

    # The other gateway's lease ends (it died); this one takes the lease back and the node returns.
    async with lab.server.store.transaction() as tx:  # type: ignore[union-attr]
        await leases.release(tx, f"gateway:{gw.gateway_id}", "gw-elsewhere")
    back = await lab.wait_connected("n1", after_seq=closed.seq, timeout=30)
    assert back.seq > closed.seq and not gw.fence.fenced
    assert "n1" in gw.sessions
