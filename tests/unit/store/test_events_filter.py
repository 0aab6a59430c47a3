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


async def test_an_event_published_in_a_rolled_back_savepoint_is_not_appended(store: Store) -> None:
    """Events are appended when the transaction commits (numbered in commit order); a part that rolled
    back takes its events with it, and a failed transaction appends none."""
    async with store.transaction() as tx:
        await events_sql.publish(tx, "kept.before", "n1", {}, 1)
        try:
            async with tx.savepoint("part"):
                await events_sql.publish(tx, "dropped", "n1", {}, 2)
                raise RuntimeError("the part fails")
        except RuntimeError:
            pass
        await events_sql.publish(tx, "kept.after", "n1", {}, 3)
    try:
        async with store.transaction() as tx:
            await events_sql.publish(tx, "failed", "n1", {}, 4)
            raise RuntimeError("the whole transaction fails")
    except RuntimeError:
        pass
    assert await _types(store, "") == ["kept.before", "kept.after"]
