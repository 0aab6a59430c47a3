"""The store: every byte of control-plane state, and all of its SQL."""

from __future__ import annotations

from pathlib import Path

from bc.clock import Clock
from bc.store.base import Row, Store, StoreError, Tx

__all__ = ["Row", "Store", "StoreError", "Tx", "open_store"]


async def open_store(url: str, clock: Clock | None = None) -> Store:
    """`sqlite:PATH` (aiosqlite), `sqlite-inline:PATH` or a bare path; opened and migrated."""
    from bc.store.sqlite import InlineSqliteStore, SqliteStore

    store: Store
    if url.startswith("sqlite-inline:"):
        store = InlineSqliteStore(url.split(":", 1)[1], clock)
    elif url.startswith("sqlite:"):
        store = SqliteStore(Path(url.split(":", 1)[1]), clock)
    elif url.startswith(("postgres://", "postgresql://")):
        raise StoreError("the PostgreSQL store is not available in this build yet")
    else:
        store = SqliteStore(Path(url), clock)
    await store.open()
    return store
