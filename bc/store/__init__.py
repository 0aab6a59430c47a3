"""The store: every byte of control-plane state, and all of its SQL."""

from __future__ import annotations

from pathlib import Path

from bc.seams.clock import Clock
from bc.store.base import Row, Store, StoreError, StoreUnreachable, Tx

__all__ = ["Row", "Store", "StoreError", "StoreUnreachable", "Tx", "open_store", "sqlite_path"]


def sqlite_path(url: str) -> Path:
    """The file of a `sqlite:` URL: `sqlite:PATH` as written; `sqlite:///PATH` and `sqlite:////PATH` both
    the absolute /PATH (the URL form and SQLAlchemy's form of an absolute path)."""
    rest = url.split(":", 1)[1]
    if rest.startswith("//"):
        rest = "/" + rest.lstrip("/")
    if not rest:
        raise StoreError(f"no file in the store URL {url!r} (sqlite:PATH or sqlite:////ABSOLUTE/PATH)")
    return Path(rest)


async def open_store(url: str, clock: Clock | None = None, *, migrate: bool = True, read_only: bool = False) -> Store:
    """`sqlite:PATH` (aiosqlite), `sqlite-inline:PATH`, `postgresql://…[?schema=NAME]` or a bare path; migrated.
    `read_only` (SQLite, `bc store copy`'s source): opened `mode=ro`, never created or migrated."""
    from bc.store.sqlite import InlineSqliteStore, SqliteStore

    store: Store
    if url.startswith("sqlite-inline:"):
        store = InlineSqliteStore(sqlite_path(url), clock)
    elif url.startswith("sqlite:"):
        store = SqliteStore(sqlite_path(url), clock, read_only=read_only)
    elif url.startswith(("postgres://", "postgresql://")):
        from bc.store.postgres import PostgresStore

        store = PostgresStore(url, clock)
    else:
        store = SqliteStore(Path(url), clock, read_only=read_only)
    await store.open(migrate=migrate and not read_only)
    return store
