"""What the gateway does with something over the size table, in either direction.

A current agent never sends anything over `bc.protocol.limits` (it fits its
results and events before it journals them), and the Admin API never stores
a payload or a spec over it; but an older agent, or rows stored before the
limits existed, can. The rule is the same everywhere: what is refused is
acknowledged, so the node stops resending it, and becomes an event the
operator sees; it is never left for the node (or the gateway) to retry
forever.

* A command result over `max_result_bytes`: the command is settled `failed`
  with `result-too-large` (if still in flight), `node.result-too-large` is
  published, and the update is acked without being stored.
* A reason or message over `max_text_bytes` is cut (they are not signed).
* A node event over `max_event_bytes` (`bc.gateway.ingest`) is recorded under
  its seq without its body, published as `node.event-too-large`, and acked.
* A stored command or spec whose frame would be over `max_frame_bytes` is not
  sent: the command is settled `failed` with `command-too-large`, and the spec
  is reported as `node.spec-too-large` (the node keeps enforcing the one it holds).
"""

from __future__ import annotations

import logging

from bc.control.base.bus import Bus
from bc.control.base.events import publish
from bc.control.commands.queue import settle_by_server
from bc.protocol.limits import LIMITS, truncate_text
from bc.protocol.pb import session_pb2
from bc.store import Tx
from bc.store import dispatch as dispatch_sql

log = logging.getLogger("bc.gateway.oversize")

RESULT_TOO_LARGE = "result-too-large"
COMMAND_TOO_LARGE = "command-too-large"


def fit_texts(update: session_pb2.CommandUpdate) -> session_pb2.CommandUpdate:
    """`update` with its reason and message cut to `max_text_bytes` (the same object when they fit)."""
    reason = truncate_text(update.reason, LIMITS.max_text_bytes)
    message = truncate_text(update.message, LIMITS.max_text_bytes)
    if reason == update.reason and message == update.message:
        return update
    out = session_pb2.CommandUpdate()
    out.CopyFrom(update)
    out.reason, out.message = reason, message
    return out


async def refuse_oversized_update(
    tx: Tx, bus: Bus | None, node_id: str, update: session_pb2.CommandUpdate, now_ms: int
) -> bool:
    """True when `update`'s result is over `max_result_bytes`: its command is settled, the refusal published,
    and the caller acks it without applying it."""
    size = len(update.result)
    if size <= LIMITS.max_result_bytes:
        return False
    cid = update.command_id
    data = {"command_id": cid, "result_bytes": size, "max_result_bytes": LIMITS.max_result_bytes}
    await publish(tx, bus, "node.result-too-large", node_id, data, now_ms)
    await settle_by_server(tx, bus, cid, node_id, "failed", RESULT_TOO_LARGE, now_ms, dispatch_sql.IN_FLIGHT)
    log.warning(
        "event=command.result-too-large node=%s command=%s bytes=%d max_result_bytes=%d",
        node_id,
        cid,
        size,
        LIMITS.max_result_bytes,
    )
    return True


async def refuse_oversized_command(
    tx: Tx, bus: Bus | None, node_id: str, command_id: str, frame_bytes: int, now_ms: int
) -> None:
    """A stored command whose frame is over `max_frame_bytes`: settled `command-too-large`, never sent."""
    data = {"command_id": command_id, "frame_bytes": frame_bytes, "max_frame_bytes": LIMITS.max_frame_bytes}
    await publish(tx, bus, "node.command-too-large", node_id, data, now_ms)
    await settle_by_server(tx, bus, command_id, node_id, "failed", COMMAND_TOO_LARGE, now_ms, dispatch_sql.IN_FLIGHT)
    log.error(
        "event=command.too-large node=%s command=%s frame_bytes=%d max_frame_bytes=%d",
        node_id,
        command_id,
        frame_bytes,
        LIMITS.max_frame_bytes,
    )
