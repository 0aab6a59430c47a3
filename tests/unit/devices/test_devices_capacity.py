"""Capacity placement: what a node offers, what is free, where a hold goes; never a double booking."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.hw.fake import FakeHardware
from bc.control.capacity.atoms import choose_node, free_atoms, offered_atoms, place
from bc.protocol.atoms import DEVICE_CLASSES, GPU, GPU_MIG, GPU_SLOT, Atom, atoms_conflict, parse_atom
from bc.protocol.pb import common_pb2


def inv(profile: str, seed: str = "node-a") -> common_pb2.Inventory:
    return FakeHardware(profile, seed).inventory()


@pytest.mark.parametrize(
    ("profile", "gpu", "mig", "slot"),
    [("hgx-h100-8", 8, 0, 0), ("mig-a100-4", 2, 6, 0), ("l4-slots-4", 4, 0, 16)],
)
def test_what_each_profile_offers(profile: str, gpu: int, mig: int, slot: int) -> None:
    i = inv(profile)
    assert len(offered_atoms(i, GPU)) == gpu
    assert len(offered_atoms(i, GPU_MIG)) == mig
    assert len(offered_atoms(i, GPU_SLOT)) == slot


def test_a_mig_enabled_gpu_offers_only_its_instances() -> None:
    i = inv("mig-a100-4")
    whole_uuids = {a.gpu_uuid for a in offered_atoms(i, GPU)}
    mig_uuids = {a.gpu_uuid for a in offered_atoms(i, GPU_MIG)}
    assert whole_uuids == {i.gpus[2].uuid, i.gpus[3].uuid}
    assert mig_uuids == {i.gpus[0].uuid, i.gpus[1].uuid}
    assert [a.atom_id for a in offered_atoms(i, GPU_MIG)][:3] == [
        f"{i.gpus[0].uuid}/1/0",
        f"{i.gpus[0].uuid}/2/0",
        f"{i.gpus[0].uuid}/3/0",
    ]


def test_an_unhealthy_gpu_offers_nothing() -> None:
    i = inv("l4-slots-4")
    i.gpus[1].healthy = False
    assert i.gpus[1].uuid not in {a.gpu_uuid for a in offered_atoms(i, GPU)}
    assert len(offered_atoms(i, GPU_SLOT)) == 12


def test_placement_is_by_gpu_index() -> None:
    i = inv("hgx-h100-8")
    placed = place(i, [], GPU, 3)
    assert placed is not None
    assert [a.gpu_uuid for a in placed] == [g.uuid for g in i.gpus[:3]]


def test_slots_are_ordered_numerically() -> None:
    i = common_pb2.Inventory(gpus=[common_pb2.Gpu(index=0, uuid="GPU-x", slots=12, healthy=True)])
    assert [a.numbers[0] for a in offered_atoms(i, GPU_SLOT)] == list(range(12))


def test_booked_atoms_block_their_relatives() -> None:
    i = inv("l4-slots-4")
    g0 = i.gpus[0].uuid
    # A slot booked on GPU 0: GPU 0 is no longer free whole; its other slots are.
    booked = [parse_atom(GPU_SLOT, f"{g0}/s1")]
    assert g0 not in {a.gpu_uuid for a in free_atoms(i, booked, GPU)}
    assert len([a for a in free_atoms(i, booked, GPU_SLOT) if a.gpu_uuid == g0]) == 3
    # GPU 0 booked whole: none of its slots are free.
    booked = [parse_atom(GPU, g0)]
    assert g0 not in {a.gpu_uuid for a in free_atoms(i, booked, GPU_SLOT)}


def test_place_returns_none_when_it_does_not_fit() -> None:
    i = inv("mig-a100-4")
    assert place(i, [], GPU, 3) is None
    assert place(i, [], GPU, 2) is not None
    assert place(i, [], GPU_SLOT, 1) is None
    with pytest.raises(ValueError):
        place(i, [], GPU, 0)
    with pytest.raises(ValueError):
        place(i, [], "tpu", 1)


def test_choose_node_prefers_the_most_free_then_the_lowest_id() -> None:
    a, b, c = inv("hgx-h100-8", "a"), inv("hgx-h100-8", "b"), inv("hgx-h100-8", "c")
    busy_a = [parse_atom(GPU, g.uuid) for g in a.gpus[:4]]
    chosen = choose_node([("a", a, busy_a), ("c", c, []), ("b", b, [])], GPU, 2)
    assert chosen is not None
    node, atoms = chosen
    assert node == "b"
    assert [x.gpu_uuid for x in atoms] == [g.uuid for g in b.gpus[:2]]
    assert choose_node([("a", a, busy_a)], GPU, 5) is None
    assert choose_node([], GPU, 1) is None


# Properties over random inventories and bookings.


@st.composite
def inventories(draw: st.DrawFn) -> common_pb2.Inventory:
    n = draw(st.integers(min_value=0, max_value=5))
    gpus = []
    for index in range(n):
        mig_enabled = draw(st.booleans())
        gpu = common_pb2.Gpu(
            index=index,
            uuid=f"GPU-{index:04d}-{draw(st.integers(0, 99))}",
            mig_enabled=mig_enabled,
            slots=0 if mig_enabled else draw(st.integers(0, 4)),
            healthy=draw(st.booleans()),
        )
        if mig_enabled:
            for gi in draw(st.sets(st.integers(1, 7), max_size=4)):
                gpu.mig_instances.add(gi=gi, ci=0, uuid=f"MIG-{index}-{gi}")
        gpus.append(gpu)
    return common_pb2.Inventory(gpus=gpus)


@st.composite
def scenario(draw: st.DrawFn) -> tuple[common_pb2.Inventory, list[Atom], str, int]:
    i = draw(inventories())
    every = [a for cls in DEVICE_CLASSES for a in offered_atoms(i, cls)]
    booked: list[Atom] = []
    for a in draw(st.permutations(every)):
        if draw(st.booleans()) and not any(atoms_conflict(a, b) for b in booked):
            booked.append(a)
    return i, booked, draw(st.sampled_from(DEVICE_CLASSES)), draw(st.integers(1, 6))


@given(scenario())
def test_a_placement_never_conflicts(s: tuple[common_pb2.Inventory, list[Atom], str, int]) -> None:
    i, booked, cls, count = s
    placed = place(i, booked, cls, count)
    free = free_atoms(i, booked, cls)
    if placed is None:
        assert len(free) < count
        return
    assert len(placed) == count
    assert all(a.device_class == cls for a in placed)
    for n, a in enumerate(placed):
        assert not any(atoms_conflict(a, b) for b in booked)
        assert not any(atoms_conflict(a, b) for b in placed[n + 1 :])


@given(scenario())
def test_placement_is_deterministic(s: tuple[common_pb2.Inventory, list[Atom], str, int]) -> None:
    i, booked, cls, count = s
    assert place(i, booked, cls, count) == place(i, list(reversed(booked)), cls, count)


@given(st.lists(scenario(), min_size=1, max_size=4), st.sampled_from(DEVICE_CLASSES), st.integers(1, 4))
def test_choose_node_picks_a_fitting_node_with_the_most_free(
    scenarios: list[tuple[common_pb2.Inventory, list[Atom], str, int]], cls: str, count: int
) -> None:
    candidates = [(f"n{k}", i, booked) for k, (i, booked, _, _) in enumerate(scenarios)]
    chosen = choose_node(candidates, cls, count)
    frees = {node: len(free_atoms(i, booked, cls)) for node, i, booked in candidates}
    fitting = [node for node, n in frees.items() if n >= count]
    if chosen is None:
        assert not fitting
        return
    node, atoms = chosen
    assert node in fitting and len(atoms) == count
    assert frees[node] == max(frees[f] for f in fitting)
    booked = next(b for n, _, b in candidates if n == node)
    assert not any(atoms_conflict(a, b) for a in atoms for b in booked)
