"""What makes a status report new (the reference's `statusKey`)."""

from __future__ import annotations

import hashlib

from bc.protocol.canonical import canonical_json
from bc.protocol.pb.common_pb2 import InstanceStatus
from bc.protocol.pb.session_pb2 import StatusReport


def status_key(report: StatusReport) -> str:
    """Everything but gauges, ages and the inventory body: a new key is worth publishing."""
    doc = {
        "applied": report.applied_generation,
        "observed": report.observed_generation,
        "hash": report.applied_spec_hash,
        "sections": [[s.section, int(s.state), s.generation, s.reason, s.message] for s in report.sections],
        "conditions": [[c.type, c.status, c.reason, c.message] for c in report.conditions],
        "inventory": report.inventory_hash,
    }
    if report.instances or report.instances_complete:  # only then: a report without VMs keeps its old key
        doc["instances"] = [
            [i.id, i.runtime, i.state, i.desired, i.message, i.managed, i.vcpus, i.memory_mib, *_later(i)]
            for i in report.instances
        ]
        doc["instances_complete"] = report.instances_complete
    return hashlib.sha256(canonical_json(doc).encode()).hexdigest()


def _later(i: InstanceStatus) -> list[object]:
    """The fields issue 37 added, only when one is set: a VM without them keeps the key it had."""
    extra: list[object] = [
        list(i.gpus),
        i.identity_rebound_ref,
        i.balloon_mib,
        list(i.volumes),
        i.image_sha256,
        i.restored_from,
    ]
    return [extra] if any(extra) else []
