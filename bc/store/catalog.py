"""What the store holds, asked of the engine's own catalog: for `bc store check`, `copy` and the tests."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from bc.store.base import Store, Tx

SEEDED = frozenset({"operators", "job_pools", "job_meta", "placement_meta"})
"""Tables the migrations themselves fill: a new store is empty but for these (and schema_version)."""

_TABLES = {
    "sqlite": "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name",
    "postgres": "SELECT table_name AS name FROM information_schema.tables"
    " WHERE table_schema = current_schema() AND table_type = 'BASE TABLE' ORDER BY table_name",
}

_REFERENCES = {
    "sqlite": 'SELECT DISTINCT m.name AS tbl, f."table" AS ref FROM sqlite_master m'
    " JOIN pragma_foreign_key_list(m.name) f WHERE m.type = 'table'",
    "postgres": "SELECT DISTINCT tc.table_name AS tbl, ccu.table_name AS ref"
    " FROM information_schema.table_constraints tc"
    " JOIN information_schema.constraint_column_usage ccu"
    " ON tc.constraint_name = ccu.constraint_name AND tc.table_schema = ccu.table_schema"
    " WHERE tc.constraint_type = 'FOREIGN KEY' AND tc.table_schema = current_schema()",
}

_SERIALS = (
    "SELECT table_name AS tbl, column_name AS col FROM information_schema.columns"
    " WHERE table_schema = current_schema() AND column_default LIKE 'nextval(%'"
)


async def table_names(store: Store) -> list[str]:
    """Every table of bc's schema, sorted."""
    async with store.transaction(write=False) as tx:
        return await tables_in(tx, store.dialect)


async def tables_in(tx: Tx, dialect: str) -> list[str]:
    return [str(r["name"]) for r in await tx.fetchall(_TABLES[dialect])]


async def parents_first(tx: Tx, dialect: str) -> list[str]:
    """Every table, each after the tables its foreign keys name (then by name): the order to fill them in."""
    tables = await tables_in(tx, dialect)
    refs: dict[str, set[str]] = {t: set() for t in tables}
    for r in await tx.fetchall(_REFERENCES[dialect]):
        if str(r["tbl"]) in refs and str(r["ref"]) != str(r["tbl"]):
            refs[str(r["tbl"])].add(str(r["ref"]))
    ordered: list[str] = []
    done: set[str] = set()
    while len(ordered) < len(tables):
        ready = sorted(t for t in tables if t not in done and refs[t] <= done)
        if not ready:  # a cycle (there is none today): fall back to the name order for the rest
            ready = sorted(t for t in tables if t not in done)
        ordered += ready
        done |= set(ready)
    return ordered


async def rows_of(tx: Tx, table: str) -> list[dict[str, Any]]:
    return await tx.fetchall(f"SELECT * FROM {_ident(table)}")


async def count_rows(tx: Tx, table: str) -> int:
    return int(await tx.fetchval(f"SELECT COUNT(*) FROM {_ident(table)}") or 0)


async def insert_row(tx: Tx, table: str, row: dict[str, Any]) -> None:
    cols = list(row)
    names = ", ".join(_ident(c) for c in cols)
    params = ", ".join(f":p{i}" for i in range(len(cols)))
    await tx.execute(
        f"INSERT INTO {_ident(table)} ({names}) VALUES ({params})",
        {f"p{i}": row[c] for i, c in enumerate(cols)},
    )


async def empty_table(tx: Tx, table: str) -> None:
    await tx.execute(f"DELETE FROM {_ident(table)}")


async def restart_sequences(tx: Tx, dialect: str) -> None:
    """After rows were copied in with their own keys, a PostgreSQL serial goes on after the largest.

    SQLite's AUTOINCREMENT follows explicit keys by itself.
    """
    if dialect != "postgres":
        return
    for r in await tx.fetchall(_SERIALS):
        t, c = _ident(str(r["tbl"])), _ident(str(r["col"]))
        await tx.fetchall(
            f"SELECT setval(pg_get_serial_sequence(:t, :c), COALESCE((SELECT MAX({c}) FROM {t}), 0) + 1, false)",
            {"t": str(r["tbl"]), "c": str(r["col"])},
        )


@dataclass(frozen=True)
class TableDigest:
    rows: int
    sha256: str


def digest_rows(rows: list[dict[str, Any]]) -> TableDigest:
    """Row count and a checksum that both engines compute alike: rows canonicalized, then sorted.

    Sorted in Python, not by ORDER BY: the engines collate text differently.
    """
    lines = sorted("\x1f".join(f"{k}={_canon(v)}" for k, v in sorted(r.items())) for r in rows)
    h = hashlib.sha256()
    for line in lines:
        h.update(line.encode("utf-8", "surrogatepass"))
        h.update(b"\x1e")
    return TableDigest(len(lines), h.hexdigest())


def _canon(v: Any) -> str:
    if v is None:
        return "n"
    if isinstance(v, bool):
        return f"i{int(v)}"
    if isinstance(v, int):
        return f"i{v}"
    if isinstance(v, float):
        return f"i{int(v)}" if v.is_integer() else f"f{v!r}"
    if isinstance(v, bytes | bytearray | memoryview):
        return "b" + bytes(v).hex()
    return "s" + str(v)


def _ident(name: str) -> str:
    if not name.replace("_", "").isalnum():
        raise ValueError(f"not a table or column name: {name!r}")
    return f'"{name}"'
