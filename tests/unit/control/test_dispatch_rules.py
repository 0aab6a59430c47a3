"""Which pending commands a session sends: credits per lane, seq order, and the guards."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from bc.control.commands.dispatch_rules import PendingCommand, guard, plan_dispatch
from bc.protocol import kinds
from bc.protocol.pb.session_pb2 import CommandBody


def cmd(
    seq: int, kind: str = "inventory.refresh", *, node: str = "n1", body: bytes | None = None, cancel: bool = False
) -> PendingCommand:
    cid = f"c{seq:04d}"
    k = kinds.get(kind)
    lane = k.lane if k else "control"
    if body is None:
        body = CommandBody(id=cid, node_id=node, kind=kind, seq=seq, not_after_ms=10**13).SerializeToString()
    return PendingCommand(cid, "n1", seq, lane, kind, body, cancel)


def test_credits_bound_each_lane_and_keep_seq_order() -> None:
    pending = [cmd(i) for i in range(20)] + [cmd(100 + i, "logs.collect") for i in range(5)]
    plan = plan_dispatch(pending, {"control": 3}, "node")
    assert plan.send == [f"c{i:04d}" for i in range(5)] + ["c0100", "c0101"]
    assert plan.cancel == []


@given(st.lists(st.integers(0, 500), unique=True, max_size=40), st.integers(0, 10))
def test_never_more_than_the_credits_and_always_the_lowest_seqs(seqs: list[int], in_flight: int) -> None:
    plan = plan_dispatch([cmd(s) for s in seqs], {"control": in_flight}, "node")
    room = max(0, kinds.GATEWAY_CREDITS["control"] - in_flight)
    assert plan.send == [f"c{s:04d}" for s in sorted(seqs)[:room]]


def test_guards_cancel_instead_of_sending() -> None:
    assert guard(cmd(1, cancel=True), "node", False) == "cancelled"
    assert guard(cmd(2, body=b"\xff\xff not a body"), "node", False) == "invalid-body"
    foreign = CommandBody(id="c0003", node_id="n2", kind="inventory.refresh", not_after_ms=10**13)
    assert guard(cmd(3, body=foreign.SerializeToString()), "node", False) == "invalid-body"
    no_deadline = CommandBody(id="c0004", node_id="n1", kind="inventory.refresh")
    assert guard(cmd(4, body=no_deadline.SerializeToString()), "node", False) == "invalid-body"
    assert guard(cmd(5, "bmc.query"), "node", False) == "kind-not-allowed"
    assert guard(cmd(6, "gpu.reset"), "node", True) == "tenant-controlled"
    assert guard(cmd(7, "gpu.reset"), "node", False) is None


def test_a_guarded_command_does_not_take_a_credit() -> None:
    plan = plan_dispatch([cmd(1, cancel=True), *[cmd(i) for i in range(2, 12)]], {}, "node")
    assert plan.cancel == [("c0001", "cancelled")]
    assert len(plan.send) == kinds.GATEWAY_CREDITS["control"]


def test_a_lane_blocked_earlier_in_the_pass_stays_blocked_though_a_credit_came_free() -> None:
    """A node's backlog read in pages: a lane out of credit on one page keeps its later commands waiting on the
    next, even if a result freed a credit meanwhile, so no command overtakes a waiting one of its lane."""
    first = plan_dispatch([cmd(i) for i in range(10)], {}, "node")
    assert first.blocked == {"control"}
    later = plan_dispatch([cmd(20), cmd(100, "logs.collect")], {"control": 7}, "node", blocked_before=first.blocked)
    assert later.send == ["c0100"]
    assert later.blocked == {"control"}
