"""The pass's helpers in `bc.control.capacity.atoms` keep its rules: the same atoms offered, the same conflicts."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from bc.control.capacity.atoms import free_among, free_atoms, offered_atoms, offered_atoms_of
from bc.control.capacity.placement_plan import GpuInfo, Mig
from bc.protocol.atoms import Atom, atoms_conflict
from bc.protocol.pb import common_pb2

gpus = st.lists(
    st.builds(
        GpuInfo,
        index=st.integers(0, 3),
        uuid=st.sampled_from(["GPU-a", "GPU-b", "GPU-c"]),
        healthy=st.booleans(),
        mig_enabled=st.booleans(),
        mig_instances=st.lists(st.builds(Mig, gi=st.integers(0, 2), ci=st.integers(0, 1)), max_size=3).map(tuple),
        slots=st.integers(0, 3),
    ),
    max_size=3,
    unique_by=lambda g: g.uuid,
)


def inventory(facts: list[GpuInfo]) -> common_pb2.Inventory:
    inv = common_pb2.Inventory()
    for g in facts:
        pb = inv.gpus.add(index=g.index, uuid=g.uuid, healthy=g.healthy, mig_enabled=g.mig_enabled, slots=g.slots)
        for m in g.mig_instances:
            pb.mig_instances.add(gi=m.gi, ci=m.ci)
    return inv


def every_atom(facts: list[GpuInfo]) -> list[Atom]:
    return [a for c in ("gpu", "gpu.mig", "gpu.slot") for a in offered_atoms_of(facts, c)]


@given(facts=gpus, device_class=st.sampled_from(["gpu", "gpu.mig", "gpu.slot"]), data=st.data())
def test_plain_facts_offer_what_the_inventory_offers_and_free_among_is_atoms_conflict(
    facts: list[GpuInfo], device_class: str, data: st.DataObject
) -> None:
    inv = inventory(facts)
    assert offered_atoms_of(facts, device_class) == offered_atoms(inv, device_class)
    pool = every_atom(facts)
    booked = data.draw(st.lists(st.sampled_from(pool), max_size=4)) if pool else []
    offered = offered_atoms_of(facts, device_class)
    assert free_among(offered, booked) == [a for a in offered if not any(atoms_conflict(a, b) for b in booked)]
    assert free_among(offered, booked) == free_atoms(inv, booked, device_class)
