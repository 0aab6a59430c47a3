"""A real store (inline SQLite on a tmp file) on the virtual loop's clock, a bus, and nodes with fake GPUs."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest
from google.protobuf.json_format import MessageToJson

from agent.hw.base import inventory_hash
from agent.hw.fake import FakeHardware
from bc.protocol.pb import common_pb2
from bc.store import Store
from bc.store import nodes as nodes_sql
from bc.store.sqlite import InlineSqliteStore

AddNode = Callable[..., Awaitable[common_pb2.Inventory]]
Count = Callable[[str], Awaitable[int]]


async def write_inventory(store: Store, node_id: str, inv: common_pb2.Inventory) -> None:
    async with store.transaction() as tx:
        await nodes_sql.write_inventory(
            tx, node_id, MessageToJson(inv, preserving_proto_field_name=True), inventory_hash(inv)
        )


@pytest.fixture
def add_node(store: InlineSqliteStore) -> AddNode:
    """Create a node row; with a profile, give it that fake hardware's inventory (returned).

    The node is `connected` unless `connectivity` says otherwise: placement picks connected nodes only.
    """

    async def add(
        node_id: str, profile: str | None = "hgx-h100-8", role: str = "node", connectivity: str = "connected"
    ) -> common_pb2.Inventory:
        now_ms = await store.now_ms()
        async with store.transaction() as tx:
            await nodes_sql.ensure(tx, node_id, role, now_ms)
            await nodes_sql.set_connectivity(tx, node_id, connectivity, now_ms)
        inv = FakeHardware(profile, node_id).inventory() if profile else common_pb2.Inventory()
        if profile:
            await write_inventory(store, node_id, inv)
        return inv

    return add


@pytest.fixture
def count(store: InlineSqliteStore) -> Count:
    async def n(table: str) -> int:
        async with store.transaction(write=False) as tx:
            return int(await tx.fetchval(f"SELECT COUNT(*) FROM {table}") or 0)

    return n
