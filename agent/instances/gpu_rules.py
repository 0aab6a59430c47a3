"""Which GPUs an instance may have passed through: the node's rule against its own spec. Pure, no I/O.

`Instance.gpus` names whole GPUs by UUID. Each must be

* in a `BINDING_INSTANCE` assignment of the instance's `allocation_id` in the
  same spec's devices section, as a whole GPU;
* in no other assignment of that section (a hold, a Kubernetes hold, another
  instance's allocation): a GPU in a hold is never passed through, whatever the
  control plane wrote;
* booked on this node for that allocation: the devices converger recorded the
  assignment (agent.instances.bookings), so it passed the node's own
  overlap check against the holds this node has;
* in the node's inventory, with a PCI bus id (VFIO binds by address).

A GPU that breaks one fails the instance with a sentence naming it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from bc.protocol.atoms import GPU, parse_atom
from bc.protocol.pb import common_pb2, spec_pb2


class GpuRuleError(Exception):
    """One sentence: why the instance cannot have this GPU."""


def _gpus_of(a: spec_pb2.DeviceAssignment) -> set[str]:
    out: set[str] = set()
    for ref in a.devices:
        try:
            out.add(parse_atom(ref.device_class, ref.atom_id).gpu_uuid)
        except ValueError:
            continue  # the devices converger fails that assignment; it books nothing here
    return out


def check(
    inst: spec_pb2.Instance,
    assignments: Sequence[spec_pb2.DeviceAssignment],
    booked: Mapping[str, frozenset[str]],
) -> None:
    """Raise GpuRuleError for the first of the instance's GPUs it may not have; return when all are fine."""
    aid = inst.allocation_id
    mine = [a for a in assignments if a.allocation_id == aid and a.binding == spec_pb2.BINDING_INSTANCE]
    whole = {ref.atom_id for a in mine for ref in a.devices if ref.device_class == GPU}
    for g in inst.gpus:
        for a in assignments:
            if a.allocation_id != aid and g in _gpus_of(a):
                what = "an instance booking" if a.binding == spec_pb2.BINDING_INSTANCE else "a hold"
                raise GpuRuleError(f"GPU {g} is in {what} of allocation {a.allocation_id}: it is not passed through")
        if g not in whole:
            raise GpuRuleError(
                f"GPU {g} is not in a BINDING_INSTANCE assignment of allocation {aid} in this spec's devices section"
            )
        if g not in booked.get(aid, frozenset()):
            raise GpuRuleError(f"GPU {g} is not booked on this node for allocation {aid} (its assignment did not bind)")


def bus_ids(uuids: Sequence[str], inventory: common_pb2.Inventory) -> list[str]:
    """Each GPU's PCI bus id from the inventory, in order (GpuRuleError for one without)."""
    by_uuid = {g.uuid: g for g in inventory.gpus}
    out: list[str] = []
    for u in uuids:
        gpu = by_uuid.get(u)
        if gpu is None:
            raise GpuRuleError(f"GPU {u} is not in this node's inventory")
        if not gpu.pci_bus_id:
            raise GpuRuleError(f"GPU {u} has no PCI bus id in the inventory: it cannot be passed through")
        out.append(gpu.pci_bus_id)
    return out
