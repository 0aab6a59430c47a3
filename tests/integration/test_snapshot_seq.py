"""Every snapshot reply carries the event seq of its own read, over real gRPC to a real `bc serve`.

A client (the TUI) reads a snapshot, then watches from its `event_seq`: a
change made after the snapshot reaches it exactly once, and one the snapshot
already shows does not come again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from bc.client.admin import AdminClient
from bc.protocol.pb import admin_pb2
from tests.integration.conftest import InprocLab

SNAPSHOTS: dict[str, Callable[[AdminClient], Awaitable[int]]] = {
    "fleet": lambda c: _seq(c.fleet_snapshot()),
    "node": lambda c: _seq(c.get_node("n1")),
    "commands": lambda c: _seq(c.commands_snapshot()),
    "jobs": lambda c: _seq(c.list_jobs()),
    "batches": lambda c: _seq(c.batches_snapshot()),
    "reservations": lambda c: _seq(c.reservations_snapshot(include_released=True)),
}


async def _seq(
    reply: Awaitable[
        admin_pb2.ListNodesResponse
        | admin_pb2.NodeInfo
        | admin_pb2.ListCommandsResponse
        | admin_pb2.ListJobsResponse
        | admin_pb2.ListBatchesResponse
        | admin_pb2.ListReservationsResponse
    ],
) -> int:
    return (await reply).event_seq


async def watched_until(lab: InprocLab, after_seq: int, last_subject: str) -> list[admin_pb2.EventRecord]:
    """Every `token.` event Watch(after_seq) streams, up to the one about `last_subject`."""

    async def collect() -> list[admin_pb2.EventRecord]:
        out: list[admin_pb2.EventRecord] = []
        async for ev in lab.admin.watch(after_seq=after_seq, type_prefix="token."):
            out.append(ev)
            if ev.subject == last_subject:
                return out
        raise AssertionError("the event stream ended")

    return await asyncio.wait_for(collect(), 15)


@pytest.mark.parametrize("snapshot", sorted(SNAPSHOTS))
async def test_a_change_after_the_snapshot_is_watched_once_and_one_before_never(lab: InprocLab, snapshot: str) -> None:
    await lab.join("n1")  # GetNode needs a node
    await lab.admin.create_token("before")
    seq = await SNAPSHOTS[snapshot](lab.admin)
    await lab.admin.create_token("after")
    await lab.admin.create_token("marker")  # where reading stops
    seen = await watched_until(lab, seq, "marker")
    assert [ev.subject for ev in seen] == ["after", "marker"]
    assert all(ev.seq > seq for ev in seen)
    (before,) = [e for e in await lab.admin.list_events(type_prefix="token.") if e.subject == "before"]
    assert before.seq <= seq


async def test_the_fleet_shows_what_happened_before_its_seq_and_the_stream_the_rest(lab: InprocLab) -> None:
    await lab.join("n1")
    snap = await lab.admin.fleet_snapshot()
    assert [n.node_id for n in snap.nodes] == ["n1"]
    await lab.join("n2")
    await lab.admin.create_token("marker")
    subjects: list[str] = []

    async def collect() -> None:
        async for ev in lab.admin.watch(after_seq=snap.event_seq):
            if ev.subject == "marker":
                return
            subjects.append(ev.subject)

    await asyncio.wait_for(collect(), 15)
    assert "n2" in subjects and "n1" not in subjects
    assert [n.node_id for n in (await lab.admin.fleet_snapshot()).nodes] == ["n1", "n2"]
