"""A node killed while holding (issue 13, I5): its hold stays booked and active, and its usage keeps
accruing on the store clock until it is released."""

from __future__ import annotations

from tests.integration.conftest import InprocLab


async def test_a_killed_nodes_hold_stays_booked_and_keeps_accruing(lab: InprocLab) -> None:
    await lab.join("n1")
    await lab.start_node("n1")
    await lab.wait_observed("n1", 1)
    res = await lab.admin.reserve(2, node_id="n1", tenant="acme")
    await lab.wait_event("reservation.active", lambda ev, d: ev.subject == res.id)
    await lab.stop_node("n1")
    await lab.wait_event("node.connectivity", lambda ev, d: ev.subject == "n1" and d["state"] == "disconnected")

    held = await lab.admin.get_reservation(res.id)
    assert (held.state, len(held.devices)) == ("active", 2)
    first = await lab.admin.usage(by="tenant")
    # The open window counts up to now: between two reads, the hold is billed for every millisecond.
    other = await lab.admin.reserve(1, node_id="n1")
    assert other.state == "pending"  # n1 is away: it waits, and takes nothing from the hold
    second = await lab.admin.usage(by="tenant")
    assert second.now_ms > first.now_ms
    (a,), (b,) = first.rows, second.rows
    assert a.key == b.key == "acme"
    assert b.atom_ms - a.atom_ms == 2 * (second.now_ms - first.now_ms)  # still billed, to the millisecond

    released = await lab.admin.release(res.id)  # usage ends at the release commit
    assert released.state == "releasing"
    third = await lab.admin.usage(by="tenant")
    fourth = await lab.admin.usage(by="tenant")
    assert third.rows[0].atom_ms == fourth.rows[0].atom_ms
