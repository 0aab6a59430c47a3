"""Which live CDI holds name a GPU: the check that keeps a reset (or a deep DCGM run) off a running workload.

The CDI files are the holds (see agent.hw.cdi), so the check reads
them fresh from disk at the moment it matters rather than trusting memory.
A hold names a GPU whole, by a MIG instance (`<uuid>/<gi>/<ci>`) or by a
slot (`<uuid>/s<n>`); any of them makes the GPU busy. So does a GPU passed
through to a VM (the passthrough records, agent.instances.passthrough, read
fresh as well): a reset would pull it from under the running guest.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from agent.hw.cdi import read_holds
from agent.instances.passthrough import passed_through
from agent.kinds.base import GPU_BUSY, KindResult
from agent.offload import Offload


@dataclass(frozen=True, order=True)
class BusyHold:
    gpu_uuid: str
    allocation_id: str
    atom_id: str


def holds_on(cdi_dir: Path, uuids: Collection[str] | None) -> list[BusyHold]:
    """The holds naming any of these GPUs (every GPU when `uuids` is None), sorted. Blocking: reads files."""
    busy: set[BusyHold] = set()
    for held in read_holds(cdi_dir).values():
        for atom in held.atoms:
            if uuids is None or atom.gpu_uuid in uuids:
                busy.add(BusyHold(atom.gpu_uuid, held.allocation_id, atom.atom_id))
    return sorted(busy)


async def busy_failure(
    cdi_dir: Path, uuids: Collection[str] | None, offload: Offload, passthrough: Path | None = None
) -> KindResult | None:
    """A `gpu-busy` failure naming every hold on these GPUs and every instance they are passed through to
    (`passthrough`: the records' directory, None when the node runs no instances), or None when none is."""
    busy = await offload(holds_on, cdi_dir, uuids)
    vms = await offload(passed_through, passthrough, uuids) if passthrough is not None else {}
    if not busy and not vms:
        return None
    named = [f"GPU {b.gpu_uuid} is held by allocation {b.allocation_id} ({b.atom_id})" for b in busy]
    named += [f"GPU {g} is passed through to instance {iid}" for g, iid in sorted(vms.items())]
    detail: list[dict[str, str]] = [
        {"uuid": b.gpu_uuid, "allocation_id": b.allocation_id, "atom_id": b.atom_id} for b in busy
    ]
    detail += [{"uuid": g, "instance": iid} for g, iid in sorted(vms.items())]
    return KindResult.failure(GPU_BUSY, "; ".join(named), {"busy": detail})
