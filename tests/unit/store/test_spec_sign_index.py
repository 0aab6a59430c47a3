"""The spec signer's read of generations waiting for a signature goes through its partial index (migration
0033): it runs every 2 s and on each poke, and scanned every node's row before (9.4 ms at 10,000 nodes)."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from bc.store import gateway_keys as gk_sql
from bc.store.sqlite import SqliteStore


class Said:
    """A transaction that keeps the statement it is handed, to ask SQLite's planner about it."""

    def __init__(self) -> None:
        self.sql = ""
        self.params: dict[str, Any] = {}

    async def fetchall(self, sql: str, params: dict[str, Any] | None = None) -> list[Any]:
        self.sql, self.params = sql, dict(params or {})
        return []


async def test_the_signer_s_read_of_waiting_specs_uses_its_partial_index(tmp_path: Path) -> None:
    path = tmp_path / "bc.db"
    store = SqliteStore(path)
    await store.open()
    await store.close()
    said = Said()
    await gk_sql.specs_to_sign(said)  # type: ignore[arg-type]
    with sqlite3.connect(path) as db:
        plan = " ".join(str(r[-1]) for r in db.execute("EXPLAIN QUERY PLAN " + said.sql, said.params))
    assert "nodes_spec_sign_pending" in plan, plan
