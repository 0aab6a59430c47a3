"""Numbered migrations, applied in order at start, each in its own transaction.

Files are `migrations/NNNN_name.sql`: statements separated by `;` at the end
of a line, written in the SQL both engines share, with placeholders for the
few types that differ (`{{BLOB}}`, `{{SERIAL_PK}}`). Applied versions are
recorded in `schema_version`; a store newer than this binary refuses to start
rather than run against a schema it does not know.
"""

from __future__ import annotations

import re
import sqlite3
from importlib import resources
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bc.store.base import Store

TYPES = {
    "sqlite": {"BLOB": "BLOB", "SERIAL_PK": "INTEGER PRIMARY KEY AUTOINCREMENT"},
    "postgres": {"BLOB": "BYTEA", "SERIAL_PK": "BIGSERIAL PRIMARY KEY"},
}


def migrations() -> list[tuple[int, str, str]]:
    """(version, name, sql) for every bundled migration, in order."""
    out = []
    for f in resources.files("bc.store").joinpath("migrations").iterdir():
        m = re.fullmatch(r"(\d{4})_(\w+)\.sql", f.name)
        if m:
            out.append((int(m.group(1)), m.group(2), f.read_text()))
    return sorted(out)


def schema_version_of(conn: sqlite3.Connection) -> int:
    """The schema version of an SQLite store opened by hand (`bc doctor` must not migrate what it inspects)."""
    return int(conn.execute("SELECT COALESCE(MAX(version), 0) FROM schema_version").fetchone()[0])


def render(sql: str, dialect: str) -> list[str]:
    for k, v in TYPES[dialect].items():
        sql = sql.replace("{{" + k + "}}", v)
    sql = "\n".join(line for line in sql.splitlines() if not line.strip().startswith("--"))
    return [s.strip() for s in re.split(r";\s*\n", sql + "\n") if s.strip()]


async def apply_migrations(store: Store, *, upto: int | None = None) -> int:
    """Apply what is missing (up to version `upto`, for tests of a migration); returns the version in force."""
    from bc.store.base import StoreError

    async with store.transaction() as tx:
        await tx.execute(
            "CREATE TABLE IF NOT EXISTS schema_version ("
            " version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at_ms BIGINT NOT NULL)"
        )
        current = int(await tx.fetchval("SELECT COALESCE(MAX(version), 0) FROM schema_version") or 0)
    known = migrations()
    latest = known[-1][0] if known else 0
    if current > latest:
        raise StoreError(f"the store's schema is version {current}, newer than this bc knows ({latest}); upgrade bc")
    for version, name, sql in known:
        if version <= current or (upto is not None and version > upto):
            continue
        now_ms = await store.now_ms()
        async with store.transaction() as tx:
            for stmt in render(sql, store.dialect):
                await tx.execute(stmt)
            await tx.execute(
                "INSERT INTO schema_version (version, name, applied_at_ms) VALUES (:v, :n, :t)",
                {"v": version, "n": name, "t": now_ms},
            )
        current = version
    return current
