"""`bc store migrate | check | copy`: the store behind `bc serve`, outside any running server.

    bc store migrate --store URL          apply the migrations this bc carries (what `bc serve` does at start)
    bc store check   --store URL          reachable? which schema version? rows per table; changes nothing
    bc store copy    --from URL --to URL  a stopped lab's store into a fleet's, every table, verified

URL: `postgresql://USER@HOST/DB[?schema=NAME]`, `sqlite:PATH` (`sqlite:///PATH` and `sqlite:////PATH`
both mean the absolute /PATH), or a bare path to an SQLite file. `--data-dir D` stands for D/bc.db.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from bc.cli.emit import emit
from bc.cli.output import Lines, lines
from bc.cli.render import render_table
from bc.errors import Conflict, Unavailable, UsageError
from bc.runtime.config import default_data_dir

if TYPE_CHECKING:
    from bc.store import Store

T = TypeVar("T")

_STORE_HELP = "postgresql://USER@HOST/DB, sqlite:PATH or a path (default: bc.db in --data-dir)."


def _url(store_url: str, data_dir: Path | None) -> str:
    if store_url and data_dir is not None:
        raise UsageError("give --store or --data-dir, not both")
    if store_url:
        return store_url
    path = (data_dir or default_data_dir()) / "bc.db"
    if not path.exists():
        raise UsageError(f"no store at {path} (give --store URL or the --data-dir of a bc serve)")
    return str(path)


def _existing(url: str) -> str:
    """A store to read: an SQLite file must already be there (opening one would create it empty)."""
    from bc.store import sqlite_path

    if url.startswith(("postgres://", "postgresql://")):
        return url
    path = sqlite_path(url) if url.startswith("sqlite") else Path(url)
    if not path.is_file():
        raise UsageError(f"no store file at {path}")
    return url


async def _open_source(url: str) -> Store:
    """`bc store copy`'s source, read-only: never created, initialised, migrated or chmodded. An SQLite file
    that is not a bc store (corrupt, or another program's) is a UsageError naming it, before the target is
    opened, so a refused copy creates nothing."""
    from bc.store import StoreError, open_store
    from bc.store.copy import schema_version

    sqlite = not url.startswith(("postgres://", "postgresql://"))
    try:
        src = await open_store(url, migrate=False, read_only=True)
    except StoreError as e:
        if sqlite:
            raise UsageError(f"the source {url} cannot be read as a store: {e}") from None
        raise
    try:
        await schema_version(src)
    except StoreError as e:
        await src.close()
        if sqlite:
            raise UsageError(f"the source {url} is not a bc store: {e}") from None
        raise
    return src


def _run(coro: Coroutine[Any, Any, T]) -> T:
    from bc.store import StoreError
    from bc.store.copy import CopyRefused

    try:
        return asyncio.run(coro)
    except CopyRefused as e:
        raise Conflict(str(e)) from e
    except StoreError as e:
        raise Unavailable(str(e)) from e


@click.group("store")
def store_group() -> None:
    """The store behind bc serve: migrate, check, copy."""


@store_group.command("migrate")
@click.option("--store", "store_url", default="", metavar="URL", help=_STORE_HELP)
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=None)
@click.option("--json", "as_json", is_flag=True)
def migrate_cmd(store_url: str, data_dir: Path | None, as_json: bool) -> None:
    """Apply the migrations this bc carries; safe to run again."""
    url = _url(store_url, data_dir)

    async def go() -> dict[str, object]:
        from bc.store import open_store
        from bc.store.copy import schema_version

        store = await open_store(url, migrate=False)
        try:
            before = await schema_version(store)
        finally:
            await store.close()
        store = await open_store(url)
        try:
            after = await schema_version(store)
            return {"store": store.description, "from_version": before, "schema_version": after}
        finally:
            await store.close()

    doc = _run(go())
    verb = "already at" if doc["from_version"] == doc["schema_version"] else f"{doc['from_version']} ->"
    emit(as_json, doc, f"{doc['store']}: schema version {verb} {doc['schema_version']}")


@store_group.command("check")
@click.option("--store", "store_url", default="", metavar="URL", help=_STORE_HELP)
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=None)
@click.option("--json", "as_json", is_flag=True)
def check_cmd(store_url: str, data_dir: Path | None, as_json: bool) -> None:
    """Whether the store is reachable and at this bc's schema version, and its rows per table; changes nothing."""
    url = _existing(_url(store_url, data_dir))

    async def go() -> dict[str, object]:
        from bc.store import catalog, open_store
        from bc.store.copy import schema_version
        from bc.store.migrate import migrations

        store = await open_store(url, migrate=False)
        try:
            version = await schema_version(store)
            async with store.transaction(write=False) as tx:
                tables = {t: await catalog.count_rows(tx, t) for t in await catalog.tables_in(tx, store.dialect)}
            return {
                "store": store.description,
                "dialect": store.dialect,
                "schema_version": version,
                "bc_schema_version": migrations()[-1][0],
                "tables": tables,
            }
        finally:
            await store.close()

    doc = _run(go())
    version, known = int(str(doc["schema_version"])), int(str(doc["bc_schema_version"]))
    tables = doc["tables"]
    assert isinstance(tables, dict)

    def text() -> Lines:
        state = (
            "current"
            if version == known
            else f"behind: run `bc store migrate` ({known - version} to apply)"
            if version < known
            else "newer than this bc: upgrade bc"
        )
        head = f"{doc['store']}: schema version {version} ({state})"
        return lines(head, render_table(["TABLE", "ROWS"], sorted(tables.items())))

    emit(as_json, doc, text)
    if version != known:
        raise Conflict(f"the store's schema version is {version}, this bc's is {known}")


@store_group.command("copy")
@click.option("--from", "src_url", required=True, metavar="URL", help="The stopped lab's store.")
@click.option("--to", "dst_url", required=True, metavar="URL", help="The new, empty store.")
@click.option("--json", "as_json", is_flag=True)
def copy_cmd(src_url: str, dst_url: str, as_json: bool) -> None:
    """Copy every table of a stopped fleet's store into an empty one, verified by row counts and checksums."""
    if src_url == dst_url:
        raise UsageError("--from and --to name the same store")
    _existing(src_url)

    async def go() -> dict[str, object]:
        from bc.seams.clock import SystemClock
        from bc.store import open_store
        from bc.store.copy import copy_store

        src = await _open_source(src_url)
        try:
            dst = await open_store(dst_url)
            try:
                tables = await copy_store(src, dst, round(SystemClock().now() * 1000))
                return {
                    "from": src.description,
                    "to": dst.description,
                    "tables": [{"table": t.name, "rows": t.rows, "sha256": t.sha256} for t in tables],
                }
            finally:
                await dst.close()
        finally:
            await src.close()

    doc = _run(go())
    rows = doc["tables"]
    assert isinstance(rows, list)

    def text() -> Lines:
        total = sum(int(r["rows"]) for r in rows)
        table = render_table(["TABLE", "ROWS", "SHA256"], [(r["table"], r["rows"], r["sha256"][:16]) for r in rows])
        return lines(table, f"copied {total} rows in {len(rows)} tables from {doc['from']} to {doc['to']}; verified")

    emit(as_json, doc, text)


COMMANDS = [store_group]
