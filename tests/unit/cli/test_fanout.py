"""`bc cmd fanout`'s pure parts and its follow (`bc.cli.fanout`), on the virtual-time loop with a fake events stream."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator
from typing import Any

import pytest

from bc.cli import fanout
from bc.errors import ProtocolError, UsageError
from bc.protocol.pb import admin_pb2


def test_node_list_refuses_empty_names_and_a_node_twice() -> None:
    assert fanout.node_list(" n1, n2 ,n3") == ["n1", "n2", "n3"]
    with pytest.raises(UsageError, match="no empty names"):
        fanout.node_list("n1,,n2")
    with pytest.raises(UsageError, match=r"^n2 appears twice in --nodes; each node gets one command$"):
        fanout.node_list("n1,n2,n2")


def test_all_is_every_live_node_whose_role_runs_the_kind() -> None:
    nodes = [
        admin_pb2.NodeInfo(node_id="n2", role="node", state="connected"),
        admin_pb2.NodeInfo(node_id="n1", role="node", state="unreachable"),
        admin_pb2.NodeInfo(node_id="s1", role="site", state="connected"),
        admin_pb2.NodeInfo(node_id="gone", role="node", state="deleted"),
        admin_pb2.NodeInfo(node_id="bad", role="node", state="connected", revoked=True),
    ]
    assert fanout.runnable_nodes(nodes, "gpu.reset") == ["n1", "n2"]
    assert fanout.runnable_nodes(nodes, "inventory.refresh") == ["n1", "n2", "s1"]
    assert fanout.runnable_nodes(nodes, "no.such.kind") == ["n1", "n2", "s1"]  # the server names it


def info(cid: str, node: str, state: str = "pending", reason: str = "") -> admin_pb2.CommandInfo:
    return admin_pb2.CommandInfo(id=cid, node_id=node, kind="inventory.refresh", state=state, reason=reason)


def test_the_progress_line_counts_states_in_lifecycle_order() -> None:
    infos = [info("a", "n1", "succeeded"), info("b", "n2", "running"), info("c", "n3"), info("d", "n4", "running")]
    assert fanout.progress_line("inventory.refresh", infos) == (
        "inventory.refresh on 4 nodes: 1 pending, 2 running, 1 succeeded"
    )
    assert fanout.progress_line("diag.nvml", infos[:1]) == "diag.nvml on 1 node: 1 succeeded"


def test_the_outcome_names_how_many_did_not_succeed_and_the_first() -> None:
    assert fanout.outcome([info("a", "n1", "succeeded")]) == ""
    infos = [info("a", "n1", "succeeded"), info("b", "n2", "failed", "nvml-error"), info("c", "n3", "expired")]
    assert fanout.outcome(infos) == (
        "2 of 3 commands did not succeed (1 expired, 1 failed); the first, b on n2: failed (nvml-error)"
    )


class FakeEvents:
    """`AdminClient.watch` for the follow: each event after its delay on the loop's clock."""

    server = "127.0.0.1:1"  # named in a reconnect note (none here: the fake's stream never breaks)

    def __init__(self, script: list[tuple[float, str, str, dict[str, Any]]], end: bool = False) -> None:
        self.script, self.end = script, end
        self.asked: tuple[int, str] | None = None

    async def watch(self, *, after_seq: int = 0, type_prefix: str = "") -> AsyncGenerator[admin_pb2.EventRecord, None]:
        self.asked = (after_seq, type_prefix)
        for seq, (delay, type_, subject, data) in enumerate(self.script, start=after_seq + 1):
            await asyncio.sleep(delay)
            yield admin_pb2.EventRecord(seq=seq, type=type_, subject=subject, data_json=json.dumps(data))
        if not self.end:
            await asyncio.Future()  # a live stream: nothing more, until the follow stops reading


async def test_follow_reads_the_log_from_the_seq_and_shows_a_line_at_most_once_a_second() -> None:
    loop = asyncio.get_running_loop()
    infos = [info("a", "n1"), info("b", "n2"), info("x", "n3", "succeeded")]  # x: settled before (a repeated key)
    events = FakeEvents(
        [
            (0.1, "command.enqueued", "a", {}),
            (0.1, "command.updated", "a", {"state": "acked"}),
            (0.1, "command.updated", "zz", {"state": "running"}),  # someone else's
            (0.1, "command.updated", "b", {"state": "running"}),
            (1.5, "command.settled", "a", {"state": "succeeded", "reason": ""}),
            (0.2, "command.settled", "b", {"state": "failed", "reason": "nvml-error"}),
        ]
    )
    shown: list[tuple[float, str]] = []
    t0 = loop.time()
    out = await fanout.follow(
        events, "inventory.refresh", infos, 41, lambda line: shown.append((loop.time() - t0, line))
    )  # type: ignore[arg-type]
    assert events.asked == (41, "command.")
    assert out is infos and [(i.state, i.reason) for i in infos] == [
        ("succeeded", ""),
        ("failed", "nvml-error"),
        ("succeeded", ""),
    ]
    assert [line for _, line in shown] == [
        "inventory.refresh on 3 nodes: 2 pending, 1 succeeded",
        "inventory.refresh on 3 nodes: 1 acked, 1 running, 1 succeeded",  # at 1 s: what stood then
        "inventory.refresh on 3 nodes: 1 running, 2 succeeded",  # a settled at 1.9 s: shown at 2 s
        "inventory.refresh on 3 nodes: 2 succeeded, 1 failed",  # the last one, at once
    ]
    times = [round(t, 1) for t, _ in shown]
    assert times == [0.0, 1.0, 2.0, 2.1]


async def test_follow_of_commands_already_settled_reads_nothing() -> None:
    events = FakeEvents([])
    shown: list[str] = []
    await fanout.follow(events, "k", [info("a", "n1", "succeeded")], 0, shown.append)  # type: ignore[arg-type]
    assert events.asked is None and shown == ["k on 1 node: 1 succeeded"]


async def test_a_stream_that_ends_before_every_command_settled_is_a_protocol_error() -> None:
    events = FakeEvents([(0.1, "command.settled", "a", {"state": "succeeded"})], end=True)
    with pytest.raises(ProtocolError, match="ended the events stream before every command settled"):
        await fanout.follow(events, "k", [info("a", "n1"), info("b", "n2")], 0, lambda _: None)  # type: ignore[arg-type]


async def test_follow_stops_waiting_for_a_pending_command_past_its_not_after() -> None:
    """A node that never connects: its command stays pending (no sweeper here to expire it); the follow
    ends at `pending_for_s` with the others settled, not when the stream ends."""
    loop = asyncio.get_running_loop()
    infos = [info("a", "n1"), info("b", "n2")]
    events = FakeEvents([(0.5, "command.settled", "a", {"state": "succeeded", "reason": ""})])
    t0 = loop.time()
    out = await fanout.follow(events, "k", infos, 0, lambda _: None, pending_for_s=3.0)  # type: ignore[arg-type]
    assert round(loop.time() - t0, 1) == 3.0
    assert [(i.node_id, i.state) for i in out] == [("n1", "succeeded"), ("n2", "pending")]


async def test_past_not_after_a_dispatched_command_is_still_followed_to_its_end() -> None:
    loop = asyncio.get_running_loop()
    infos = [info("a", "n1")]
    events = FakeEvents(
        [
            (0.5, "command.updated", "a", {"state": "running"}),
            (4.5, "command.settled", "a", {"state": "succeeded", "reason": ""}),
        ]
    )
    t0 = loop.time()
    out = await fanout.follow(events, "k", infos, 0, lambda _: None, pending_for_s=1.0)  # type: ignore[arg-type]
    assert round(loop.time() - t0, 1) == 5.0 and out[0].state == "succeeded"


def test_away_nodes_are_named_in_order_with_their_state() -> None:
    nodes = [
        admin_pb2.NodeInfo(node_id="n1", state="connected"),
        admin_pb2.NodeInfo(node_id="n2", state="new"),
        admin_pb2.NodeInfo(node_id="n3", state="unreachable", state_age_ms=310_000),
        admin_pb2.NodeInfo(node_id="n4", state="disconnected"),
    ]
    away = fanout.away_nodes(nodes, ["n3", "n1", "n2", "n4"])
    assert [n.node_id for n in away] == ["n3", "n2"]
    assert fanout.away_line(away, skipped=True, not_after="10m") == (
        "skipping 2 nodes away (--skip-away): n3 (unreachable for 5m), n2 (new: never connected)"
    )
    assert fanout.away_line(away[1:], skipped=False, not_after="10m") == (
        "1 node away: n2 (new: never connected); their commands wait for them until --not-after (10m), "
        "--skip-away leaves them out"
    )
