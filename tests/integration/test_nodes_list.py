"""`bc nodes --json` at more than one page: what the operator's CLI prints is what the store holds.

The store is seeded through its own writes (`bench.nodes_list.seed`: a spec, a session with a Hello's
8-GPU inventory, a certificate, a status, a GPU cordon on one node in 50; the sessions on the lab's own
gateway, so its liveness pass leaves them be while the test reads), on SQLite and PostgreSQL; the
CLI runs as an operator runs it (a new process) against the lab's real `bc serve`, which streams the
listing in pages of 1,000 (`ListNodesStream`). The pages themselves are read one at a time from the
shared query (`bc.control.reads.queries.fleet_pages`) while nodes join, to pin down the page boundary.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sys
from typing import Any

import pytest
from google.protobuf import json_format

from agent.hw.fake import FakeHardware
from bc.cli.msg_json import message_to_json
from bc.control.reads import queries
from bc.store import nodes as nodes_sql
from bench.nodes_list import seed
from tests.integration.conftest import InprocLab

AGES = ("last_seen_age_ms", "state_age_ms")


def _without_ages(doc: dict[str, Any]) -> dict[str, Any]:
    """A listed node without its ages (they are relative to each read's clock)."""
    return {k: v for k, v in doc.items() if k not in AGES}


async def _bc_nodes_json(lab: InprocLab) -> Any:
    """`bc nodes --json` in a new process, as an operator runs it (the lab's server is on this loop)."""
    assert lab.server.operator_config is not None
    env = dict(os.environ, BC_CONFIG=str(lab.server.operator_config))
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bc.cli.main",
        "nodes",
        "--json",
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    return json.loads(out)


@pytest.mark.parametrize(
    "count",
    [
        1100,  # two pages of the server's 1,000
        # Three pages; seeding 2,500 nodes on PostgreSQL takes 3-4 s of the test's 5 (make test-slow).
        pytest.param(2500, marks=pytest.mark.slow),
    ],
)
async def test_bc_nodes_json_over_several_pages_is_the_store(lab: InprocLab, count: int) -> None:
    store = lab.server.store
    assert store is not None
    await seed(store, count, random.Random(4), gateway_id=lab.server.gateway_id)
    printed = await _bc_nodes_json(lab)
    # The store's rows as the one-transaction listing (the unary ListNodes) renders them.
    whole = await queries.fleet(store)
    expected = [_without_ages(message_to_json(n)) for n in whole.nodes]
    assert len(printed) == count == len(expected)
    assert [_without_ages(n) for n in printed] == expected
    assert [n["node_id"] for n in printed] == sorted(f"node-{i:05d}" for i in range(count))
    cordoned = [n for n in printed if any(r.endswith(" cordoned") for r in n["no_schedule"])]
    assert [n["node_id"] for n in cordoned] == [f"node-{i:05d}" for i in range(7, count, 50)]
    assert all(n["cert_not_after_ms"] > 0 and n["gateway_id"] == lab.server.gateway_id for n in printed)


async def test_a_node_joining_mid_listing_is_listed_once_or_else_watched(lab: InprocLab) -> None:
    store = lab.server.store
    assert store is not None
    await seed(store, 250, random.Random(5), gateway_id=lab.server.gateway_id)
    pages = queries.fleet_pages(store, page_size=100)
    first = await anext(pages)
    assert [n.node_id for n in first.nodes][-1] == "node-00099"
    # Between the first page and the second: one node sorting before the pages read, one after.
    await lab.join("node-00050b")
    await lab.join("node-00200b")
    rest = [page async for page in pages]
    assert [len(p.nodes) for p in (first, *rest)] == [100, 100, 51]
    assert {p.event_seq for p in rest} == {first.event_seq}
    listed = [n.node_id for p in (first, *rest) for n in p.nodes]
    assert len(listed) == len(set(listed)) == 251  # nothing repeated across a page boundary
    assert "node-00200b" in listed and "node-00050b" not in listed
    # What the listing did not show, the events after its seq do.
    joined = await lab.admin.list_events(after_seq=first.event_seq, type_prefix="node.joined")
    assert {e.subject for e in joined} == {"node-00050b", "node-00200b"}


async def test_the_client_reads_the_stream_in_the_pages_it_asks_for(lab: InprocLab) -> None:
    store = lab.server.store
    assert store is not None
    await seed(store, 230, random.Random(6), gateway_id=lab.server.gateway_id)
    await lab.join("node-00100b")  # an event: the snapshot's seq is read with its first page
    sizes = [len(p.nodes) async for p in lab.admin.fleet_pages(page_size=100)]
    assert sizes == [100, 100, 31]
    snapshot = await lab.admin.fleet_snapshot()
    assert [n.node_id for n in snapshot.nodes] == sorted([f"node-{i:05d}" for i in range(230)] + ["node-00100b"])
    assert snapshot.event_seq == (await lab.admin.server_info()).event_seq > 0


async def test_a_gpu_gone_unhealthy_shows_in_the_listing_at_its_next_inventory(lab: InprocLab) -> None:
    """The listing keeps what it parsed of each inventory (by the node's inventory hash): a new inventory,
    with a new hash, is read again, so a GPU's health shows at the next `bc nodes`."""
    store = lab.server.store
    assert store is not None
    await seed(store, 3, random.Random(7), gateway_id=lab.server.gateway_id)

    async def flags() -> dict[str, list[str]]:
        return {n.node_id: list(n.no_schedule) for n in (await lab.admin.fleet_snapshot()).nodes}

    assert await flags() == {"node-00000": [], "node-00001": [], "node-00002": []}
    inv = FakeHardware("hgx-h100-8", "bench", rng=random.Random(7)).inventory()
    inv.gpus[2].healthy = False
    async with store.transaction() as tx:
        await nodes_sql.write_inventory(
            tx, "node-00001", json_format.MessageToJson(inv, preserving_proto_field_name=True), "sha256:sick"
        )
    assert await flags() == {"node-00000": [], "node-00001": [f"GPU {inv.gpus[2].uuid} unhealthy"], "node-00002": []}
    inv.gpus[2].healthy = True
    async with store.transaction() as tx:
        await nodes_sql.write_inventory(
            tx, "node-00001", json_format.MessageToJson(inv, preserving_proto_field_name=True), "sha256:well"
        )
    assert await flags() == {"node-00000": [], "node-00001": [], "node-00002": []}
