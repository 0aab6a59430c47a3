"""Table leases for gateways and singleton workers."""

from __future__ import annotations

from dataclasses import dataclass

from bc.store.base import Tx

# Take or renew: the row changes only for its holder or once it expired; the epoch moves with the holder.
_TAKE = (
    "INSERT INTO leases (name, holder, expires_at_ms, epoch) VALUES (:n, :h, :e, 1)"
    " ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, expires_at_ms = excluded.expires_at_ms,"
    " epoch = CASE WHEN leases.holder = excluded.holder THEN leases.epoch ELSE leases.epoch + 1 END"
    " WHERE leases.holder = excluded.holder OR leases.expires_at_ms < :now"
)


@dataclass(frozen=True)
class Lease:
    """A lease row as a take left it: who holds it, until when, at which epoch."""

    holder: str
    expires_at_ms: int
    epoch: int


@dataclass
class Claim:
    """A process's hold on a named lease: the name, its own holder string, and the epoch it took the lease at
    (0: not yet). Routing and certificate writes that carry it are refused once the lease moved on."""

    name: str
    holder: str
    epoch: int = 0


async def acquire(tx: Tx, name: str, holder: str, now_ms: int, ttl_ms: int) -> bool:
    """Take or renew a lease; True when `holder` holds it afterwards."""
    return (await take(tx, name, holder, now_ms, ttl_ms)).holder == holder


async def take(tx: Tx, name: str, holder: str, now_ms: int, ttl_ms: int) -> Lease:
    """Take or renew a lease; the row afterwards (`holder` holds it when the row names it)."""
    tx.memo.pop(f"lease:{name}", None)
    await tx.execute(_TAKE, {"n": name, "h": holder, "e": now_ms + ttl_ms, "now": now_ms})
    row = await tx.fetchone("SELECT holder, expires_at_ms, epoch FROM leases WHERE name = :n", {"n": name})
    assert row is not None, "the row was just written"
    return Lease(str(row["holder"]), int(row["expires_at_ms"]), int(row["epoch"]))


async def release(tx: Tx, name: str, holder: str) -> None:
    tx.memo.pop(f"lease:{name}", None)
    await tx.execute("DELETE FROM leases WHERE name = :n AND holder = :h", {"n": name, "h": holder})


async def give_up(tx: Tx, name: str, holder: str) -> None:
    """Let the lease go now but keep its row, so its epoch keeps counting (a gateway's, whose epoch fences)."""
    tx.memo.pop(f"lease:{name}", None)
    await tx.execute("UPDATE leases SET expires_at_ms = 0 WHERE name = :n AND holder = :h", {"n": name, "h": holder})


async def held(tx: Tx, name: str, holder: str, now_ms: int, dialect: str, epoch: int = 0) -> bool:
    """Whether `holder` still holds the lease now (at `epoch`, when given); on PostgreSQL the row is share-locked
    to the transaction's end, so the lease cannot move while the routing write that checked it commits.

    Read once a transaction: a group commit runs many sessions' routing writes in one, and the row cannot
    change under the share lock (PostgreSQL) or the single writer (SQLite) until it commits, so each later
    check compares its own `now_ms` with the expiry read the first time."""
    key = f"lease:{name}"
    if key not in tx.memo:
        lock = " FOR SHARE" if dialect == "postgres" else ""
        tx.memo[key] = await tx.fetchone(
            f"SELECT holder, expires_at_ms, epoch FROM leases WHERE name = :n{lock}", {"n": name}
        )
    row = tx.memo[key]
    return (
        row is not None
        and row["holder"] == holder
        and int(row["expires_at_ms"]) > now_ms
        and (not epoch or int(row["epoch"]) == epoch)
    )
