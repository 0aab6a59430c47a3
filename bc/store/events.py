"""The events log: append-only, sequenced; Admin Watch and the tests read it from any point."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from bc.store.base import Row, Tx


async def publish(tx: Tx, type_: str, subject: str, data: dict[str, Any], now_ms: int) -> None:
    """Appended when `tx` commits, numbered in commit order (see `Tx.append_at_commit`): a follower reading
    `seq > after` never skips an event that committed after a higher-numbered one."""
    tx.append_at_commit(
        "events", {"type": type_, "subject": subject, "data": json.dumps(data, sort_keys=True), "at_ms": now_ms}
    )


async def list_events(tx: Tx, after_seq: int, limit: int, type_prefix: str = "") -> list[Row]:
    """Events after `after_seq` whose type starts with the literal text `type_prefix`.

    Not LIKE: `_` and `%` would be wildcards there, and SQLite's LIKE ignores ASCII case.
    """
    return await tx.fetchall(
        "SELECT seq, type, subject, data, at_ms FROM events"
        " WHERE seq > :after AND substr(type, 1, length(:prefix)) = :prefix ORDER BY seq LIMIT :limit",
        {"after": after_seq, "prefix": type_prefix, "limit": limit},
    )


async def of_types_since(tx: Tx, after_seq: int, types: Iterable[str]) -> list[Row]:
    """The events after `after_seq` of one of `types` (seq, type, data), in order: one range of the
    (type, seq) index per type."""
    names = sorted(set(types))
    if not names:
        return []
    params: dict[str, object] = {"after": after_seq}
    params.update({f"t{i}": t for i, t in enumerate(names)})
    marks = ", ".join(f":t{i}" for i in range(len(names)))
    return await tx.fetchall(
        f"SELECT seq, type, data FROM events WHERE type IN ({marks}) AND seq > :after ORDER BY seq", params
    )


async def last_seq(tx: Tx) -> int:
    return int(await tx.fetchval("SELECT COALESCE(MAX(seq), 0) FROM events") or 0)


async def count(tx: Tx, type_: str, subject: str, since_ms: int) -> int:
    """How many events of this type about this subject since `since_ms`."""
    v = await tx.fetchval(
        "SELECT COUNT(*) FROM events WHERE type = :t AND subject = :s AND at_ms >= :since",
        {"t": type_, "s": subject, "since": since_ms},
    )
    return int(v or 0)
