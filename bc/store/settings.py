"""Server settings that outlive a restart."""

from __future__ import annotations

from bc.store.base import Tx


async def get(tx: Tx, key: str) -> str | None:
    v = await tx.fetchval("SELECT value FROM settings WHERE key = :k", {"k": key})
    return None if v is None else str(v)


async def put(tx: Tx, key: str, value: str) -> None:
    await tx.execute(
        "INSERT INTO settings (key, value) VALUES (:k, :v) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
        {"k": key, "v": value},
    )
