"""Operators, their roles and the serials of the certificates issued to them."""

from __future__ import annotations

from bc.store.base import Row, Tx

_WITH_CERTS = (
    "SELECT o.*, (SELECT COUNT(*) FROM operator_certs c WHERE c.name = o.name) AS certificates,"
    " (SELECT MAX(c.not_after_ms) FROM operator_certs c WHERE c.name = o.name) AS cert_not_after_ms"
    " FROM operators o"
)


async def get(tx: Tx, name: str) -> Row | None:
    return await tx.fetchone(f"{_WITH_CERTS} WHERE o.name = :n", {"n": name})


async def list_all(tx: Tx) -> list[Row]:
    return await tx.fetchall(f"{_WITH_CERTS} ORDER BY o.name", {})


async def insert(tx: Tx, name: str, role: str, created_by: str, now_ms: int) -> bool:
    """False when the name is taken (a revoked operator's name stays taken: its history names it)."""
    n = await tx.execute(
        "INSERT INTO operators (name, role, created_at_ms, created_by) VALUES (:n, :r, :t, :b)"
        " ON CONFLICT (name) DO NOTHING",
        {"n": name, "r": role, "t": now_ms, "b": created_by},
    )
    return n == 1


async def add_cert(tx: Tx, serial: str, name: str, not_after_ms: int, now_ms: int) -> bool:
    n = await tx.execute(
        "INSERT INTO operator_certs (serial, name, not_after_ms, issued_at_ms) VALUES (:s, :n, :na, :t)"
        " ON CONFLICT (serial) DO NOTHING",
        {"s": serial, "n": name, "na": not_after_ms, "t": now_ms},
    )
    return n == 1


async def cert(tx: Tx, serial: str) -> Row | None:
    return await tx.fetchone("SELECT * FROM operator_certs WHERE serial = :s", {"s": serial})


async def revoke(tx: Tx, name: str, by: str, reason: str, now_ms: int) -> bool:
    n = await tx.execute(
        "UPDATE operators SET revoked_at_ms = :t, revoked_by = :b, revoke_reason = :r"
        " WHERE name = :n AND revoked_at_ms IS NULL",
        {"t": now_ms, "b": by, "r": reason, "n": name},
    )
    return n == 1


async def live_admins(tx: Tx) -> int:
    v = await tx.fetchval("SELECT COUNT(*) FROM operators WHERE role = 'admin' AND revoked_at_ms IS NULL", {})
    return int(v or 0)


async def set_role(tx: Tx, name: str, role: str) -> bool:
    n = await tx.execute(
        "UPDATE operators SET role = :r WHERE name = :n AND revoked_at_ms IS NULL", {"r": role, "n": name}
    )
    return n == 1
