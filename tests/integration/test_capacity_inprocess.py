"""A node killed while holding (issue 13, I5): its hold stays booked and active, and its usage keeps
accruing on the store clock until it is released."""

from __future__ import annotations

import json

from bc.control.capacity.invariants import check_billing_conservation
from bc.control.capacity.placement_pass import span_of
from bc.control.capacity.views import window_of
from bc.store import capacity as cap_sql
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


async def test_a_hold_its_node_refuses_at_admission_is_placed_on_another_node(lab: InprocLab) -> None:
    """Capacity's arithmetic is an estimate; the node's admission has the last word (issue 13). n1 admits
    what its host has left after the huge page pool and a headroom, which the plan does not model, so a
    second big-memory hold fits n1 on paper and is refused there: it is placed on n2, not failed."""
    gib = 1 << 30
    for n in ("n1", "n2"):
        await lab.join(n)
        await lab.start_node(n)
        await lab.wait_observed(n, 0)
    first = await lab.admin.reserve(1, node_id="n1", memory_bytes=1000 * gib)
    await lab.wait_event("reservation.active", lambda ev, d: ev.subject == first.id)

    second = await lab.admin.reserve(1, memory_bytes=950 * gib, tenant="acme")
    assert second.node_id == "n1"  # first fit, on paper
    refused = await lab.wait_event("reservation.refused", lambda ev, d: ev.subject == second.id)
    facts = json.loads(refused.data_json)
    assert (facts["node_id"], facts["reason"], facts["attempt"]) == ("n1", "resources-exhausted", 1)
    assert "MiB of memory needed" in facts["message"]
    await lab.wait_event("reservation.active", lambda ev, d: ev.subject == second.id)
    held = await lab.admin.get_reservation(second.id)
    assert (held.state, held.node_id, len(held.devices)) == ("active", "n2", 1)
    assert held.allocation_id == f"{second.allocation_id}.2"  # a new allocation id: the old one stays n1's
    assert (await lab.admin.get_reservation(first.id)).state == "active"  # the refusal took nothing from it

    # Billing: the refused placement counts from its placement to the refusal, on n1; then n2 from its own
    # placement. Flushed and open windows add up to the booked spans, with no key twice (I8).
    for r in (first, second):  # usage is flushed at the release commit
        assert (await lab.admin.release(r.id)).state == "releasing"
    store = lab.server.store
    assert store is not None
    now = await store.now_ms()
    async with store.transaction(write=False) as tx:
        spans = [span_of(r) for r in await cap_sql.billing_spans(tx)]
        windows = [window_of(r) for r in await cap_sql.usage_windows(tx, None, None)]
    mine = [s for s in spans if s.reservation_id == second.id]
    assert [s.node_id for s in mine] == ["n1", "n2"]
    assert check_billing_conservation(spans, windows, now) is None
    by_node = {r.key: r.atom_ms for r in (await lab.admin.usage(by="node")).rows}
    assert by_node["n1"] >= mine[0].used_ms(now)  # the refused span is billed where it was booked
