"""Why a node takes no new holds (NoSchedule), as short reasons an operator reads in `bc nodes`.

One rule for the listing and for placement: a node that is revoked, cordoned, held by a job (a drain,
a reboot), or not connected now (new, disconnected, unreachable) takes no new holds chosen
automatically; a GPU its inventory calls unhealthy, or a GPU-level cordon took out (the health
reconciler's, docs/health.md: `cordoned`, or `quarantined` for a person), takes none at all, while the
node's other GPUs still may. None of these ever releases a hold already there (I5): they only keep new ones away.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any


def reasons(
    *,
    connectivity: str,
    cordoned: bool,
    job_hold: str,
    revoked: bool,
    unhealthy_gpus: Sequence[str] = (),
    cordoned_gpus: Sequence[tuple[str, bool]] = (),
) -> list[str]:
    """The node's NoSchedule reasons, most lasting first; empty when it takes new holds."""
    out: list[str] = []
    if revoked:
        out.append("revoked")
    if cordoned:
        out.append("cordoned")
    if job_hold:
        out.append(f"job {job_hold}")
    if connectivity != "connected":
        out.append(connectivity)
    out.extend(f"GPU {uuid} unhealthy" for uuid in unhealthy_gpus)
    out.extend(f"GPU {uuid} {'quarantined' if quarantined else 'cordoned'}" for uuid, quarantined in cordoned_gpus)
    return out


def unhealthy_gpus(inventory_json: str) -> list[str]:
    """The UUIDs of the GPUs an inventory (protobuf JSON) reports unhealthy, in index order."""
    doc: Mapping[str, Any] = json.loads(inventory_json or "{}")
    gpus = sorted(doc.get("gpus", []), key=lambda g: int(g.get("index", 0)))
    return [str(g.get("uuid", "")) for g in gpus if not g.get("healthy", False) and g.get("uuid")]
