"""Table leases for gateways and singleton workers."""

from __future__ import annotations

from bc.store.base import Tx


async def acquire(tx: Tx, name: str, holder: str, now_ms: int, ttl_ms: int) -> bool:
    """Take or renew a lease; True when `holder` holds it afterwards."""
    await tx.execute(
        "INSERT INTO leases (name, holder, expires_at_ms) VALUES (:n, :h, :e)"
        " ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, expires_at_ms = excluded.expires_at_ms"
        " WHERE leases.holder = excluded.holder OR leases.expires_at_ms < :now",
        {"n": name, "h": holder, "e": now_ms + ttl_ms, "now": now_ms},
    )
    v = await tx.fetchval("SELECT holder FROM leases WHERE name = :n", {"n": name})
    return bool(v == holder)


async def release(tx: Tx, name: str, holder: str) -> None:
    await tx.execute("DELETE FROM leases WHERE name = :n AND holder = :h", {"n": name, "h": holder})


async def held(tx: Tx, name: str, holder: str, now_ms: int, dialect: str) -> bool:
    """Whether `holder` still holds the lease now; on PostgreSQL the row is share-locked to the transaction's
    end, so the lease cannot move while the routing write that checked it commits."""
    lock = " FOR SHARE" if dialect == "postgres" else ""
    v = await tx.fetchval(
        f"SELECT holder FROM leases WHERE name = :n AND expires_at_ms > :now{lock}",
        {"n": name, "now": now_ms},
    )
    return bool(v == holder)
