"""Status reports: where a node stands, written latest-wins about once a second.

`observed_generation` moves only forward and never past the newest spec;
applied generation and hash are fenced to the session that reported them.
Conditions arrive with ages on the node's monotonic clock; `since_ms` is
derived here from the store clock, so no node's wall clock is trusted. A
report worth publishing is compared with the stored one: each condition that
appears, changes status or reason, or goes is a `node.condition` event
(docs/health.md), so the events log tells a GPU's health story.
"""

from __future__ import annotations

import functools
import json
from typing import Any

from google.protobuf import json_format

from bc.control.base.bus import Bus
from bc.control.base.events import publish
from bc.protocol.canonical import message_to_dict
from bc.protocol.pb import common_pb2
from bc.protocol.pb.session_pb2 import StatusReport
from bc.store import Store, Tx
from bc.store import nodes as nodes_sql

STATE_NAMES = {v: k for k, v in common_pb2.SectionState.items()}


@functools.lru_cache(maxsize=16384)
def _section_doc(wire: bytes) -> dict[str, object]:
    """A section's status as JSON, made once per distinct section: most reports repeat the last one's.
    Shared between calls: read it, never change it."""
    s = common_pb2.SectionStatus()
    s.ParseFromString(wire)
    return message_to_dict(s)


def conditions_doc(report: StatusReport, now_ms: int) -> list[dict[str, Any]]:
    """The report's conditions as stored: each with `since_ms`, its age turned into the store's time."""
    return [{**message_to_dict(c), "since_ms": now_ms - c.age_ms} for c in report.conditions]


def status_doc(report: StatusReport, now_ms: int, conditions: list[dict[str, Any]] | None = None) -> dict[str, object]:
    doc: dict[str, object] = {
        "applied_generation": report.applied_generation,
        "observed_generation": report.observed_generation,
        "applied_spec_hash": report.applied_spec_hash,
        "sections": [_section_doc(s.SerializeToString(deterministic=True)) for s in report.sections],
        "conditions": conditions_doc(report, now_ms) if conditions is None else conditions,
    }
    if report.instances or report.instances_complete:  # the node's VMs (docs/instances.md), as reported
        doc["instances"] = [message_to_dict(i) for i in report.instances]
        doc["instances_complete"] = report.instances_complete
    if report.HasField("volume_storage"):  # a gauge, outside the report's key: as fresh as the last write
        doc["volume_storage"] = message_to_dict(report.volume_storage)
    return doc


def condition_changes(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The `node.condition` events between two stored condition lists (by type; a new message alone is no change)."""
    old = {str(c.get("type", "")): c for c in before}
    new = {str(c.get("type", "")): c for c in after}
    out: list[dict[str, Any]] = []
    for t, c in new.items():
        prev = old.get(t)
        if prev is None or (prev.get("status"), prev.get("reason")) != (c.get("status"), c.get("reason")):
            out.append(
                {
                    "type": t,
                    "status": c.get("status", ""),
                    "reason": c.get("reason", ""),
                    "message": c.get("message", ""),
                    "before_status": prev.get("status", "") if prev else "",
                    "before_reason": prev.get("reason", "") if prev else "",
                }
            )
    for t, prev in old.items():
        if t not in new:
            out.append(
                {
                    "type": t,
                    "status": "",
                    "reason": "Gone",
                    "message": "",
                    "before_status": prev.get("status", ""),
                    "before_reason": prev.get("reason", ""),
                }
            )
    return sorted(out, key=lambda e: e["type"])


async def ingest(store: Store, bus: Bus, node_id: str, epoch: int, report: StatusReport, *, publish_it: bool) -> bool:
    """Write one coalesced report in a transaction of its own; returns True when observed_generation advanced."""
    now_ms = await store.now_ms()
    async with store.transaction() as tx:
        return await write_report(tx, bus, node_id, epoch, report, now_ms, publish_it=publish_it)


async def write_report(
    tx: Tx, bus: Bus, node_id: str, epoch: int, report: StatusReport, now_ms: int, *, publish_it: bool
) -> bool:
    """`ingest` inside the caller's transaction (the gateway's group commit): every change is in `tx`."""
    if not await nodes_sql.session_is_current(tx, node_id, epoch):
        return False  # a superseded session's report: facts of an old epoch do not route
    await nodes_sql.set_applied(tx, node_id, epoch, report.applied_generation, report.applied_spec_hash)
    advanced = await nodes_sql.advance_observed(tx, node_id, report.observed_generation)
    conditions = conditions_doc(report, now_ms)
    doc = status_doc(report, now_ms, conditions)
    changes: list[dict[str, Any]] = []
    if publish_it:
        before = json.loads(await nodes_sql.status(tx, node_id) or "{}")
        changes = condition_changes(before.get("conditions", []), conditions)
    await nodes_sql.write_status(tx, node_id, json.dumps(doc, sort_keys=True))
    if report.HasField("inventory"):
        await nodes_sql.write_inventory(
            tx,
            node_id,
            json_format.MessageToJson(report.inventory, preserving_proto_field_name=True),
            report.inventory_hash,
        )
    if publish_it:
        data: dict[str, Any] = {
            "applied_generation": report.applied_generation,
            "observed_generation": report.observed_generation,
            "sections": {s.section: STATE_NAMES.get(s.state, "?") for s in report.sections},
        }
        if report.HasField("inventory"):  # the placement loop passes again for a new inventory (placement_wake)
            data["inventory_hash"] = report.inventory_hash
        await publish(tx, bus, "node.status", node_id, data, now_ms)
    for change in changes:
        await publish(tx, bus, "node.condition", node_id, change, now_ms)
    if advanced:
        await publish(tx, bus, "node.observed", node_id, {"observed_generation": report.observed_generation}, now_ms)
    return advanced
