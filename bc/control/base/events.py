"""Publishing to the events log inside the caller's transaction."""

from __future__ import annotations

from typing import Any

from bc.control.base import actor
from bc.control.base.bus import Bus
from bc.store import Tx
from bc.store import events as events_sql


async def publish(tx: Tx, bus: Bus | None, type_: str, subject: str, data: dict[str, Any], now_ms: int) -> None:
    """Append an event; watchers wake after the transaction commits.

    A write made through the Admin API names its operator in the event (`bc.control.base.actor`).
    """
    operator = actor.current()
    if operator and "operator" not in data:
        data = {**data, "operator": operator}
    await events_sql.publish(tx, type_, subject, data, now_ms)
    if bus is not None:
        tx.on_commit(bus.events_published)
