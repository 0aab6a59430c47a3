"""`bc store copy`: a lab's store into a fleet's, every table, verified, nodes keeping their identities.

The fleet is stopped while it runs: a source whose gateway or worker lease has not expired is
refused, and so is a target that already holds anything beyond what its migrations seed. Both
stores must be at the schema version this bc knows (`bc store migrate` the source first). The
source is read in one transaction (one consistent snapshot) and the target written in one: the
copy lands whole or not at all. Before the target commits, every table is read back and compared
with the source by row count and checksum (`catalog.digest_rows`), so a value one engine would
have changed on the way (a type, an encoding) fails the copy instead of landing.
"""

from __future__ import annotations

from dataclasses import dataclass

from bc.store import catalog
from bc.store.base import Store, StoreError
from bc.store.migrate import migrations

KEEP = frozenset({"schema_version"})
"""Tables the copy leaves as the target's own migrations wrote them."""


class CopyRefused(StoreError):
    """The copy would lose or mix data; the message says why and what to do."""


@dataclass(frozen=True)
class CopiedTable:
    name: str
    rows: int
    sha256: str


async def schema_version(store: Store) -> int:
    async with store.transaction(write=False) as tx:
        return int(await tx.fetchval("SELECT COALESCE(MAX(version), 0) FROM schema_version") or 0)


async def live_leases(store: Store, now_ms: int) -> list[str]:
    """Leases a running bc serve holds (`name held by holder`): the fleet is not stopped."""
    async with store.transaction(write=False) as tx:
        rows = await tx.fetchall(
            "SELECT name, holder FROM leases WHERE expires_at_ms > :now ORDER BY name", {"now": now_ms}
        )
    return [f"{r['name']} held by {r['holder']}" for r in rows]


async def check_copyable(src: Store, dst: Store, now_ms: int) -> None:
    latest = migrations()[-1][0]
    for side, store in (("source", src), ("target", dst)):
        version = await schema_version(store)
        if version != latest:
            raise CopyRefused(
                f"the {side} store is at schema version {version} and this bc's is {latest}: "
                f"run `bc store migrate --store …` on it first"
            )
    held = await live_leases(src, now_ms)
    if held:
        raise CopyRefused(f"stop the fleet first: the source store has live leases ({'; '.join(held)})")
    async with dst.transaction(write=False) as tx:
        for t in await catalog.tables_in(tx, dst.dialect):
            if t not in KEEP | catalog.SEEDED and await catalog.count_rows(tx, t):
                raise CopyRefused(f"the target store is not empty (table {t} has rows): copy into a new database")
    src_tables = set(await catalog.table_names(src))
    dst_tables = set(await catalog.table_names(dst))
    if src_tables != dst_tables:
        raise CopyRefused(f"the stores' tables differ: {sorted(src_tables ^ dst_tables)}")


async def copy_store(src: Store, dst: Store, now_ms: int) -> list[CopiedTable]:
    """Copy every table of `src` into `dst` in one transaction; the tables copied, with their checksums."""
    await check_copyable(src, dst, now_ms)
    async with src.transaction(write=False) as stx:
        data = {t: await catalog.rows_of(stx, t) for t in await catalog.tables_in(stx, src.dialect) if t not in KEEP}
    copied: list[CopiedTable] = []
    async with dst.transaction() as tx:
        order = [t for t in await catalog.parents_first(tx, dst.dialect) if t not in KEEP]
        for t in reversed(order):
            if t in catalog.SEEDED:
                await catalog.empty_table(tx, t)
        for t in order:
            for row in data[t]:
                await catalog.insert_row(tx, t, row)
        await catalog.restart_sequences(tx, dst.dialect)
        for t in order:
            want = catalog.digest_rows(data[t])
            got = catalog.digest_rows(await catalog.rows_of(tx, t))
            if got != want:
                raise CopyRefused(
                    f"table {t} did not copy faithfully ({want.rows} rows {want.sha256[:12]} in the source,"
                    f" {got.rows} rows {got.sha256[:12]} read back): nothing was written"
                )
            copied.append(CopiedTable(t, want.rows, want.sha256))
    return copied
