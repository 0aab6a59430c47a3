"""agent.framing: no frame the agent writes is over its budget, and nothing it owes is lost in the packing."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from agent.framing import budget_after_refusal, pack_events, pack_hello, trim_status
from bc.protocol.limits import LIMITS, Limits
from bc.protocol.pb import common_pb2, session_pb2
from bc.protocol.pb.session_pb2 import NodeMessage

HELLO = NodeMessage(hello=session_pb2.Hello(node_id="n1", boot_id="b1", journal_id="j-1", inventory_hash="h"))

sizes = st.lists(st.integers(min_value=0, max_value=5000), max_size=40)
budgets = st.integers(min_value=6000, max_value=40_000)


def update(i: int, result_bytes: int) -> session_pb2.CommandUpdate:
    return session_pb2.CommandUpdate(
        command_id=f"c{i:04d}", state=session_pb2.COMMAND_SUCCEEDED, result=b"r" * result_bytes, boot_id="b1"
    )


@given(sizes, budgets)
@settings(max_examples=200, deadline=None)
def test_hello_fits_its_budget_and_every_result_is_in_it_or_after_it_in_order(
    result_sizes: list[int], budget: int
) -> None:
    updates = [update(i, n) for i, n in enumerate(result_sizes)]
    hello, rest = pack_hello(HELLO, updates, budget)
    assert hello.ByteSize() <= budget
    assert [u.command_id for u in [*hello.hello.unacked_results, *rest]] == [u.command_id for u in updates]
    assert hello.hello.node_id == "n1" and hello.hello.journal_id == "j-1"  # the rest of the Hello is untouched
    if rest:  # it stopped only because the next one did not fit
        grown = NodeMessage()
        grown.CopyFrom(hello)
        grown.hello.unacked_results.append(rest[0])
        assert grown.ByteSize() > budget - 16


def test_results_too_many_for_one_frame_follow_the_hello() -> None:
    updates = [update(i, 1_000_000) for i in range(6)]  # ~6 MB owed, a frame holds ~4
    hello, rest = pack_hello(HELLO, updates, LIMITS.max_frame_bytes)
    assert len(hello.hello.unacked_results) == 4 and len(rest) == 2
    assert hello.ByteSize() <= LIMITS.max_frame_bytes
    assert all(NodeMessage(command_update=u).ByteSize() <= LIMITS.max_frame_bytes for u in rest)


@given(st.lists(st.integers(min_value=0, max_value=3000), max_size=60), budgets)
@settings(max_examples=200, deadline=None)
def test_event_batches_fit_the_budget_and_keep_every_event_in_order(body_sizes: list[int], budget: int) -> None:
    events = [session_pb2.NodeEvent(seq=i + 1, type="t", body=b"e" * n) for i, n in enumerate(body_sizes)]
    batches = pack_events("j-1", events, budget)
    assert [e.seq for b in batches for e in b.events] == [e.seq for e in events]
    assert all(b.journal_id == "j-1" and b.events for b in batches)
    assert all(NodeMessage(event_batch=b).ByteSize() <= budget for b in batches)


def test_status_texts_are_cut_to_max_text_bytes() -> None:
    rep = session_pb2.StatusReport(applied_generation=3)
    rep.sections.add(section="devices", message="x" * 100_000, reason="r" * 10)
    rep.conditions.add(type="Ready", message="y" * 100_000)
    out = trim_status(rep)
    assert len(out.sections[0].message.encode()) <= LIMITS.max_text_bytes
    assert out.sections[0].message.startswith("x" * 1000) and out.sections[0].reason == "r" * 10
    assert len(out.conditions[0].message.encode()) <= LIMITS.max_text_bytes
    assert rep.sections[0].message == "x" * 100_000  # the agent's own copy is left alone
    assert trim_status(session_pb2.StatusReport(inventory=common_pb2.Inventory(hostname="h"))).inventory.hostname == "h"


def test_a_gateway_refusing_a_frame_lowers_the_budget_below_its_limit() -> None:
    details = "SERVER: Received message larger than max (3500000 vs. 2000000)"
    budget = budget_after_refusal("RESOURCE_EXHAUSTED", details, LIMITS.max_frame_bytes)
    assert budget == 2_000_000 - 64 * 1024
    # never below the smallest frame that still carries one maximal update
    tiny = budget_after_refusal("RESOURCE_EXHAUSTED", details.replace("2000000", "100000"), LIMITS.max_frame_bytes)
    assert tiny == LIMITS.min_frame_bytes
    # never raised by a refusal
    assert budget_after_refusal("RESOURCE_EXHAUSTED", details, 1_500_000) == max(LIMITS.min_frame_bytes, 1_500_000)


def test_only_the_peer_refusing_our_frame_changes_the_budget() -> None:
    ours = "CLIENT: Received message larger than max (5000000 vs. 4194304)"  # the gateway's frame, refused here
    assert budget_after_refusal("RESOURCE_EXHAUSTED", ours, LIMITS.max_frame_bytes) is None
    assert budget_after_refusal("RESOURCE_EXHAUSTED", "too many Hellos", LIMITS.max_frame_bytes) is None
    assert budget_after_refusal("UNAVAILABLE", "Received message larger than max (5 vs. 4)", 10) is None


def test_the_floor_follows_the_table() -> None:
    small = Limits(max_result_bytes=1000, max_text_bytes=100, max_event_bytes=500)
    details = "SERVER: Received message larger than max (9 vs. 1)"
    assert budget_after_refusal("RESOURCE_EXHAUSTED", details, 10**6, small) == small.min_frame_bytes
