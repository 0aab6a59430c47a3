"""Table leases for gateways and singleton workers."""

from __future__ import annotations

from bc.store.base import Tx


async def acquire(tx: Tx, name: str, holder: str, now_ms: int, ttl_ms: int) -> bool:
    """Take or renew a lease; True when `holder` holds it afterwards."""
    tx.memo.pop(f"lease:{name}", None)
    await tx.execute(
        "INSERT INTO leases (name, holder, expires_at_ms) VALUES (:n, :h, :e)"
        " ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, expires_at_ms = excluded.expires_at_ms"
        " WHERE leases.holder = excluded.holder OR leases.expires_at_ms < :now",
        {"n": name, "h": holder, "e": now_ms + ttl_ms, "now": now_ms},
    )
    v = await tx.fetchval("SELECT holder FROM leases WHERE name = :n", {"n": name})
    return bool(v == holder)


async def release(tx: Tx, name: str, holder: str) -> None:
    tx.memo.pop(f"lease:{name}", None)
    await tx.execute("DELETE FROM leases WHERE name = :n AND holder = :h", {"n": name, "h": holder})


async def held(tx: Tx, name: str, holder: str, now_ms: int, dialect: str) -> bool:
    """Whether `holder` still holds the lease now; on PostgreSQL the row is share-locked to the transaction's
    end, so the lease cannot move while the routing write that checked it commits.

    Read once a transaction: a group commit runs many sessions' routing writes in one, and the row cannot
    change under the share lock (PostgreSQL) or the single writer (SQLite) until it commits, so each later
    check compares its own `now_ms` with the expiry read the first time."""
    key = f"lease:{name}"
    if key not in tx.memo:
        lock = " FOR SHARE" if dialect == "postgres" else ""
        tx.memo[key] = await tx.fetchone(f"SELECT holder, expires_at_ms FROM leases WHERE name = :n{lock}", {"n": name})
    row = tx.memo[key]
    return row is not None and row["holder"] == holder and int(row["expires_at_ms"]) > now_ms
