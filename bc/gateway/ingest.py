"""Node events in: stored once per (journal, seq), handled, acknowledged.

Events above the node's cumulative ack for its current journal are stored,
published as `node.event`, and run through the report handlers, each under a
savepoint: a failing handler rolls back its own writes, is published as
`node.report-failed`, and does not stop the stream (an unacked event would
only be replayed into the same failure). A report whose body names another
node is `security.node-mismatch` and never reaches a handler; an
undecodable one is `security.invalid-report`. With attested bindings (on with
command signing: the `Signer` says so) a report must carry the node's own
signature, else it is `security.report-rejected` (and
`reservation.binding-rejected` for a binding).

Sizes: an event over `max_event_bytes` (an older agent's) is recorded under
its seq without its body, published as `node.event-too-large` and acked, never
handled; a current agent journals such an event as `event.too-large` itself,
which is published the same way.
"""

from __future__ import annotations

import json
import logging

from google.protobuf.message import DecodeError

from bc.control.base.bus import Bus
from bc.control.base.events import publish
from bc.control.capacity.reservations import mark_binding_lost, on_allocation_report
from bc.control.signing import attestation
from bc.control.signing.signer import Signer
from bc.protocol.limits import LIMITS
from bc.protocol.pb import session_pb2
from bc.store import Store, Tx
from bc.store import node_events as node_events_sql

log = logging.getLogger("bc.gateway.ingest")

KIND_NAMES = {
    session_pb2.AllocationReport.BOUND: "bound",
    session_pb2.AllocationReport.RELEASED: "released",
    session_pb2.AllocationReport.FAILED: "failed",
}


# What a node refuses on its own, raised to the operator as security events.
SECURITY_EVENTS = {"spec.rejected": "security.spec-rejected"}
# What a node could not journal as it was, raised to the operator as node events.
NODE_EVENTS = {
    "event.too-large": "node.event-too-large",
    "instance.rules-restored": "instance.rules-restored",  # the node put flushed instance rules back
}


def _json_body(body: bytes) -> dict[str, object]:
    try:
        doc = json.loads(body or b"{}")
    except ValueError:
        return {"raw": body[:200].hex()}
    return doc if isinstance(doc, dict) else {"value": doc}


async def _handle(
    tx: Tx, bus: Bus, signer: Signer, store: Store, node_id: str, ev: session_pb2.NodeEvent, now_ms: int
) -> None:
    if not ev.HasField("report"):
        await publish(tx, bus, "node.event", node_id, {"seq": ev.seq, "type": ev.type}, now_ms)
        if ev.type in SECURITY_EVENTS:
            await publish(tx, bus, SECURITY_EVENTS[ev.type], node_id, _json_body(ev.body), now_ms)
        if ev.type in NODE_EVENTS:
            await publish(tx, bus, NODE_EVENTS[ev.type], node_id, {"seq": ev.seq, **_json_body(ev.body)}, now_ms)
        return
    rep = session_pb2.AllocationReport()
    try:
        rep.ParseFromString(ev.report.body)
    except DecodeError:
        await publish(tx, bus, "security.invalid-report", node_id, {"seq": ev.seq, "type": ev.type}, now_ms)
        return
    kind = KIND_NAMES.get(rep.kind, "unknown")
    data = {
        "seq": ev.seq,
        "type": ev.type,
        "allocation_id": rep.allocation_id,
        "kind": kind,
        "reason": rep.reason,
        "cdi_devices": list(rep.cdi_devices),
        "generation": rep.generation,
    }
    if rep.node_id != node_id:
        await publish(tx, bus, "security.node-mismatch", node_id, {**data, "named_node": rep.node_id}, now_ms)
        return
    why = await attestation.check_report(tx, signer, node_id, ev.report)
    if why is not None:
        await _reject_report(tx, bus, store, node_id, rep, {**data, "why": why}, now_ms)
        return
    await publish(tx, bus, "node.event", node_id, data, now_ms)
    try:
        async with tx.savepoint("report_handler"):
            outcome = await on_allocation_report(
                tx,
                bus,
                signer,
                node_id,
                kind,
                rep.allocation_id,
                rep.reason,
                rep.message,
                now_ms,
                lock=store.for_update(),
            )
    except Exception as e:  # a handler bug must not wedge the stream; say so loudly
        log.exception("event=node.report-failed node=%s seq=%d", node_id, ev.seq)
        await publish(tx, bus, "node.report-failed", node_id, {**data, "error": str(e)}, now_ms)
        return
    log.info(
        "event=allocation.report node=%s allocation=%s kind=%s outcome=%s", node_id, rep.allocation_id, kind, outcome
    )


async def _reject_report(
    tx: Tx,
    bus: Bus,
    store: Store,
    node_id: str,
    rep: session_pb2.AllocationReport,
    data: dict[str, object],
    now_ms: int,
) -> None:
    """A report without the node's signature changes nothing, except that a forged re-report of an
    active binding marks it lost: the binding can no longer be trusted, yet nothing is released."""
    await publish(tx, bus, "security.report-rejected", node_id, data, now_ms)
    if rep.kind == session_pb2.AllocationReport.BOUND:
        await publish(tx, bus, "reservation.binding-rejected", node_id, data, now_ms)
        lost = await mark_binding_lost(
            tx, bus, node_id, rep.allocation_id, str(data["why"]), now_ms, store.for_update()
        )
        if lost:
            log.warning("event=reservation.lost node=%s allocation=%s why=%s", node_id, rep.allocation_id, data["why"])


async def _refuse_event(tx: Tx, bus: Bus, node_id: str, ev: session_pb2.NodeEvent, size: int, now_ms: int) -> None:
    """Over `max_event_bytes`: kept out of the store and the handlers, acked with the rest, and said."""
    limit = LIMITS.max_event_bytes
    data = {"seq": ev.seq, "type": ev.type[:256], "bytes": size, "max_event_bytes": limit}
    await publish(tx, bus, "node.event-too-large", node_id, data, now_ms)
    log.warning("event=node.event-too-large node=%s seq=%d type=%s bytes=%d", node_id, ev.seq, ev.type[:256], size)


async def ingest_in(
    tx: Tx, store: Store, bus: Bus, signer: Signer, node_id: str, batch: session_pb2.EventBatch, now_ms: int
) -> session_pb2.Ack | None:
    """Store and handle a batch in the caller's transaction (the gateway's group commit); returns the Ack to
    send once it commits, or None for another journal's batch. `store` only says how this engine locks rows."""
    sess = await node_events_sql.session_cursor(tx, node_id)
    if sess is None or str(sess["journal_id"]) != batch.journal_id:
        return None
    acked = int(sess["acked_event_seq"])
    top = acked
    for ev in sorted(batch.events, key=lambda e: e.seq):
        if ev.seq <= acked:
            continue
        size = ev.ByteSize()
        too_large = size > LIMITS.max_event_bytes
        new = await node_events_sql.insert(
            tx,
            node_id=node_id,
            journal_id=batch.journal_id,
            seq=ev.seq,
            type_=ev.type,
            body=b"" if too_large else ev.SerializeToString(),
            now_ms=now_ms,
        )
        if new and too_large:
            await _refuse_event(tx, bus, node_id, ev, size, now_ms)
        elif new:
            await _handle(tx, bus, signer, store, node_id, ev, now_ms)
        top = max(top, ev.seq)
    if top > acked:
        await node_events_sql.advance_ack(tx, node_id, batch.journal_id, top)
    return session_pb2.Ack(journal_id=batch.journal_id, event_seq=top)
