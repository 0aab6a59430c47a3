"""`bc events --type T`: the types that start with the literal text T, on both drivers."""

from __future__ import annotations

from bc.store import Store
from bc.store import events as events_sql

TYPES = ["node.status", "node_status", "nodeXstatus", "NODE.status", "a%b", "axb", "security.batch-unapproved"]


async def _types(store: Store, prefix: str) -> list[str]:
    async with store.transaction(write=False) as tx:
        return [str(r["type"]) for r in await events_sql.list_events(tx, 0, 100, prefix)]


async def _seed(store: Store) -> None:
    async with store.transaction() as tx:
        for i, t in enumerate(TYPES):
            await events_sql.publish(tx, t, "n1", {}, i)


async def test_underscore_and_percent_are_characters_not_wildcards(store: Store) -> None:
    await _seed(store)
    assert await _types(store, "node_") == ["node_status"]
    assert await _types(store, "node.") == ["node.status"]
    assert await _types(store, "a%") == ["a%b"]
    assert await _types(store, "%") == []
    assert await _types(store, "_") == []


async def test_the_prefix_is_case_sensitive(store: Store) -> None:
    await _seed(store)
    assert await _types(store, "NODE.") == ["NODE.status"]


async def test_an_empty_prefix_is_every_event(store: Store) -> None:
    await _seed(store)
    assert await _types(store, "") == TYPES
