"""Why a node takes no new holds (NoSchedule), as short reasons an operator reads in `bc nodes`.

One rule for the listing and for placement: a node that is revoked, cordoned, held by a job (a drain,
a reboot), or not connected now (new, disconnected, unreachable) takes no new holds chosen
automatically; a GPU its inventory calls unhealthy, or a GPU-level cordon took out (the health
reconciler's, docs/health.md: `cordoned`, or `quarantined` for a person), takes none at all, while the
node's other GPUs still may. None of these ever releases a hold already there (I5): they only keep new ones away.
"""

from __future__ import annotations

import hashlib
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


class UnhealthyGpusMemo:
    """`unhealthy_gpus` of inventories already parsed once: a node's inventory changes at a Hello or a
    refresh, while the fleet listing reads every one of them at each call (13 µs to parse an 8-GPU
    inventory; 0.13 s of a 10,000-node listing).

    Keyed by the node and the inventory's hash as the node reported it with the inventory (the store writes
    the two in one statement): a node can only make its own row stale by lying about its hash, which shows
    nothing it could not report outright. Without a hash (an older row), by a digest of the text. At most
    `max_entries`, the oldest forgotten first; no inventory text is kept."""

    def __init__(self, max_entries: int = 65_536) -> None:
        self._max = max_entries
        self._known: dict[tuple[str, str] | bytes, tuple[str, ...]] = {}

    def known(self, node_id: str, inventory_hash: str) -> tuple[str, ...] | None:
        """What an inventory with this hash was found to hold, if it was parsed already (no text needed: the
        listing reads the inventories of the others only)."""
        return self._known.get((node_id, inventory_hash)) if inventory_hash else None

    def __call__(self, node_id: str, inventory_json: str, inventory_hash: str = "") -> tuple[str, ...]:
        key: tuple[str, str] | bytes
        if inventory_hash:
            key = (node_id, inventory_hash)
        else:  # blake2b, not hash(): two inventories a node could choose must not collide
            key = hashlib.blake2b(inventory_json.encode(), digest_size=16).digest()
        found = self._known.get(key)
        if found is None:
            found = tuple(unhealthy_gpus(inventory_json))
            if len(self._known) >= self._max:
                del self._known[next(iter(self._known))]
            self._known[key] = found
        return found
