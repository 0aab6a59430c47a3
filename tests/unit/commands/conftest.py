"""The command queue over a real store (inline SQLite on a tmp file), the virtual loop's clock, and recorded pokes."""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from google.protobuf import any_pb2

from bc.control.base.bus import Bus
from bc.control.commands.queue import EnqueueRequest, enqueue
from bc.control.signing.signer import Signer
from bc.store import Row
from bc.store import events as events_sql
from bc.store import nodes as nodes_sql
from bc.store.sqlite import InlineSqliteStore


@pytest.fixture
def pokes(bus: Bus) -> list[str]:
    """The nodes whose gateway was poked, in order (pokes run after commit)."""
    out: list[str] = []
    bus.on_node_changed(out.append)
    return out


AddNode = Callable[..., Awaitable[None]]
Enqueue = Callable[..., Awaitable[Row]]
Count = Callable[[str], Awaitable[int]]
Events = Callable[[str], Awaitable[list[Row]]]


@pytest.fixture
def add_node(store: InlineSqliteStore) -> AddNode:
    async def add(node_id: str, role: str = "node") -> None:
        now_ms = await store.now_ms()
        async with store.transaction() as tx:
            await nodes_sql.ensure(tx, node_id, role, now_ms)

    return add


@pytest.fixture
def put(store: InlineSqliteStore, bus: Bus, signer: Signer, rng: random.Random) -> Enqueue:
    """Enqueue with defaults: `put("n1")` queues an inventory.refresh with an empty payload."""

    async def go(node_id: str = "n1", kind: str = "inventory.refresh", **kw: Any) -> Row:
        payload = kw.pop("payload", any_pb2.Any())
        req = EnqueueRequest(node_id=node_id, kind=kind, payload=payload, **kw)
        return await enqueue(store, bus, signer, req, rng)

    return go


@pytest.fixture
def count(store: InlineSqliteStore) -> Count:
    async def n(table: str) -> int:
        async with store.transaction(write=False) as tx:
            return int(await tx.fetchval(f"SELECT COUNT(*) FROM {table}") or 0)

    return n


@pytest.fixture
def events(store: InlineSqliteStore) -> Events:
    async def ev(prefix: str) -> list[Row]:
        async with store.transaction(write=False) as tx:
            return await events_sql.list_events(tx, 0, 1000, prefix)

    return ev
