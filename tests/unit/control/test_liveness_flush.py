"""A gateway's liveness flush of many sessions in one UPDATE (`nodes.mark_seen_many`), on both stores: each
row only forward and only under the epoch it names, and more rows than one statement takes."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from bc.store import Store
from bc.store import nodes as nodes_sql
from bc.store.nodes import SEEN_ROWS_PER_UPDATE

AddNode = Callable[..., Awaitable[object]]
N = SEEN_ROWS_PER_UPDATE + 20


async def last_seen(store: Store) -> dict[str, int | None]:
    async with store.transaction(write=False) as tx:
        rows = await nodes_sql.list_all(tx)
    return {str(r["node_id"]): r["last_seen_ms"] for r in rows}


async def test_one_flush_moves_each_node_forward_under_its_own_epoch_only(store: Store, add_node: AddNode) -> None:
    ids = [f"n{i:03d}" for i in range(N)]
    epochs: dict[str, int] = {}
    for node_id in ids:
        await add_node(node_id, profile=None)
        async with store.transaction() as tx:
            opened = await nodes_sql.open_session(
                tx,
                node_id=node_id,
                gateway_id="gw-1",
                journal_id="j",
                boot_id="b",
                incarnation_id="i",
                cert_serial=f"s{node_id}",
                now_ms=1_000,
            )
        epochs[node_id] = opened.epoch
    async with store.transaction() as tx:
        assert await nodes_sql.mark_seen_many(tx, [(n, epochs[n], 50_000) for n in ids]) == N
    before = await last_seen(store)
    assert {before[n] for n in ids} == {50_000}

    stale_epoch, older, newer = ids[0], ids[1], ids[2:]
    async with store.transaction() as tx:
        changed = await nodes_sql.mark_seen_many(
            tx,
            [(stale_epoch, epochs[stale_epoch] + 1, 60_000), (older, epochs[older], 40_000)]
            + [(n, epochs[n], 60_000 + k) for k, n in enumerate(newer)],
        )
    after = await last_seen(store)
    assert changed == len(newer)
    assert after[stale_epoch] == 50_000  # another epoch's flush: fenced
    assert after[older] == 50_000  # never backwards
    assert [after[n] for n in newer] == [60_000 + k for k in range(len(newer))]
    async with store.transaction() as tx:
        assert await nodes_sql.mark_seen_many(tx, []) == 0
        assert await nodes_sql.mark_seen(tx, older, epochs[older], 70_000)
        assert not await nodes_sql.mark_seen(tx, older, epochs[older], 69_000)
