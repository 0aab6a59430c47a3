"""NoSchedule as `bc nodes` shows it: one reason per cause, the control plane's NodeUnreachable condition."""

from __future__ import annotations

import json

import pytest

from bc.control.capacity import no_schedule
from bc.control.reads import views
from bc.store import nodes as nodes_sql
from bc.store.sqlite import InlineSqliteStore
from tests.unit.control.conftest import AddNode, write_inventory


def test_reasons_name_every_cause() -> None:
    assert no_schedule.reasons(connectivity="connected", cordoned=False, job_hold="", revoked=False) == []
    assert no_schedule.reasons(
        connectivity="unreachable", cordoned=True, job_hold="j-1", revoked=True, unhealthy_gpus=["GPU-a"]
    ) == ["revoked", "cordoned", "job j-1", "unreachable", "GPU GPU-a unhealthy"]


def test_unhealthy_gpus_in_index_order() -> None:
    inv = {"gpus": [{"index": 1, "uuid": "GPU-b"}, {"index": 0, "uuid": "GPU-a", "healthy": True}, {"index": 2}]}
    assert no_schedule.unhealthy_gpus(json.dumps(inv)) == ["GPU-b"]
    assert no_schedule.unhealthy_gpus("") == []


@pytest.mark.parametrize("connectivity", ["disconnected", "unreachable"])
async def test_node_info_carries_the_reasons_and_an_unreachable_node_its_condition(
    store: InlineSqliteStore, add_node: AddNode, connectivity: str
) -> None:
    inv = await add_node("n1", connectivity=connectivity)
    inv.gpus[3].healthy = False
    await write_inventory(store, "n1", inv)
    async with store.transaction() as tx:
        await tx.execute("UPDATE nodes SET job_hold = 'j-7' WHERE node_id = 'n1'")
        row = await nodes_sql.get(tx, "n1")
    assert row is not None
    info = views.node_info(row, await store.now_ms(), detail=True)
    assert list(info.no_schedule) == ["job j-7", connectivity, f"GPU {inv.gpus[3].uuid} unhealthy"]
    assert info.job_hold == "j-7"
    unreachable = [c for c in info.conditions if c.type == "NodeUnreachable"]
    assert len(unreachable) == (1 if connectivity == "unreachable" else 0)
