"""Migration 0006 rebuilds the quorum tables (a CHECK cannot be altered in SQLite): nothing stored is lost."""

from __future__ import annotations

from functools import partial

import pytest

from bc.store import StoreError
from bc.store import quorum as q_sql
from bc.store.migrate import apply_migrations
from tests.unit.store.conftest import MakeStore


async def test_batches_survive_the_rebuild_and_may_be_withdrawn(
    make_store: MakeStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    for driver in ("bc.store.sqlite", "bc.store.postgres"):
        monkeypatch.setattr(f"{driver}.apply_migrations", partial(apply_migrations, upto=5))
    old = make_store()
    await old.open()
    async with old.transaction() as tx:
        await tx.execute(  # as 0004 wrote it: no dag_id yet
            "INSERT INTO batches (id, kind, state, requested_by, reason, payload_json, scope_root, threshold,"
            " created_at_ms, not_after_ms) VALUES ('b-1', 'gpu.reset', 'pending', 'alice', 'xid 79', '{}', :root,"
            " 2, 5, 99)",
            {"root": b"\x01" * 32},
        )
        await q_sql.insert_leaf(tx, "b-1", 0, "n1", "gpu.reset", b"\x02" * 32, "c-1")
        await tx.execute(
            "INSERT INTO batch_approvals (batch_id, key_id, name, decision, signature, at_ms, operator)"
            " VALUES ('b-1', 'k1', 'bob', 'approve', :s, 7, 'bob')",
            {"s": b"sig"},
        )
    await old.close()
    monkeypatch.undo()

    new = make_store()
    await new.open()
    try:
        async with new.transaction() as tx:
            batch = await q_sql.get_batch(tx, "b-1")
            assert batch is not None
            assert (batch["state"], batch["reason"], bytes(batch["scope_root"])) == ("pending", "xid 79", b"\x01" * 32)
            assert [(r["node_id"], r["command_id"]) for r in await q_sql.leaves(tx, "b-1")] == [("n1", "c-1")]
            assert [(d["name"], d["operator"]) for d in await q_sql.decisions(tx, "b-1")] == [("bob", "bob")]
            await tx.execute("UPDATE batches SET state = 'withdrawn' WHERE id = 'b-1'")
        with pytest.raises(StoreError):
            async with new.transaction() as tx:
                await tx.execute("UPDATE batches SET state = 'lost' WHERE id = 'b-1'")
    finally:
        await new.close()
