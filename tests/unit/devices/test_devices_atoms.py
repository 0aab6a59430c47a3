"""Atom ids, the parent-aware conflict rule and CDI naming: what both ends of the wire must agree on."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bc.protocol.atoms import (
    CDI_KIND,
    GPU,
    GPU_MIG,
    GPU_SLOT,
    Atom,
    atoms_conflict,
    cdi_name,
    cdi_qualified,
    infer_atom,
    parse_atom,
)

UUID = "GPU-3f2a9c1e-0b7d-4e21-9a55-0c1d2e3f4a5b"
CDI_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]*")

uuids = st.sampled_from(["GPU-aaaa-0001", "GPU-bbbb-0002", "GPU-cccc-0003"])
small = st.integers(min_value=0, max_value=12)


def whole(uuid: str) -> Atom:
    return parse_atom(GPU, uuid)


def mig(uuid: str, gi: int, ci: int) -> Atom:
    return parse_atom(GPU_MIG, f"{uuid}/{gi}/{ci}")


def slot(uuid: str, n: int) -> Atom:
    return parse_atom(GPU_SLOT, f"{uuid}/s{n}")


children = st.one_of(
    st.builds(mig, uuids, small, small),
    st.builds(slot, uuids, small),
)
atoms = st.one_of(st.builds(whole, uuids), children)


def test_parse_each_class() -> None:
    assert parse_atom(GPU, UUID) == Atom(GPU, UUID, UUID)
    assert parse_atom(GPU_MIG, f"{UUID}/1/0") == Atom(GPU_MIG, UUID, f"{UUID}/1/0")
    assert parse_atom(GPU_MIG, f"{UUID}/1/0").numbers == (1, 0)
    assert parse_atom(GPU_SLOT, f"{UUID}/s3") == Atom(GPU_SLOT, UUID, f"{UUID}/s3")
    assert parse_atom(GPU_SLOT, f"{UUID}/s3").numbers == (3,)


@pytest.mark.parametrize(
    ("device_class", "atom_id"),
    [
        (GPU, f"{UUID}/1/0"),  # a MIG id under the gpu class
        (GPU, ""),
        (GPU, "GPU_with_underscore"),  # would make cdi_name ambiguous
        (GPU_MIG, UUID),
        (GPU_MIG, f"{UUID}/01/0"),  # leading zero: a second spelling of 1/0
        (GPU_MIG, f"{UUID}/1"),
        (GPU_MIG, f"{UUID}/1/0/2"),
        (GPU_SLOT, f"{UUID}/3"),
        (GPU_SLOT, f"{UUID}/s-1"),
        (GPU_SLOT, f"{UUID}/s03"),
        ("nic", UUID),
    ],
)
def test_parse_refuses_a_mismatch(device_class: str, atom_id: str) -> None:
    with pytest.raises(ValueError):
        parse_atom(device_class, atom_id)


def test_unknown_class_names_the_classes() -> None:
    with pytest.raises(ValueError, match=r"gpu, gpu\.mig, gpu\.slot"):
        parse_atom("fpga", UUID)


@given(atoms)
def test_infer_reads_the_class_back_from_the_id(atom: Atom) -> None:
    assert infer_atom(atom.atom_id) == atom


def test_cdi_names() -> None:
    assert CDI_KIND == "bc.dev/gpu"
    assert cdi_name(UUID) == UUID
    assert cdi_name(f"{UUID}/1/0") == f"{UUID}_1_0"
    assert cdi_name(f"{UUID}/s2") == f"{UUID}_s2"
    assert cdi_qualified(f"{UUID}/s2") == f"bc.dev/gpu={UUID}_s2"


@given(atoms)
def test_cdi_names_follow_the_cdi_rules(atom: Atom) -> None:
    name = cdi_name(atom.atom_id)
    assert "/" not in name
    assert CDI_NAME_RE.fullmatch(name)
    kind, _, rest = cdi_qualified(atom.atom_id).partition("=")
    assert kind.count("/") == 1 and rest == name


@given(atoms, atoms)
def test_cdi_name_is_one_to_one(a: Atom, b: Atom) -> None:
    assert (cdi_name(a.atom_id) == cdi_name(b.atom_id)) == (a == b)


@given(atoms, atoms)
def test_conflict_is_symmetric(a: Atom, b: Atom) -> None:
    assert atoms_conflict(a, b) == atoms_conflict(b, a)


@given(atoms)
def test_an_atom_conflicts_with_itself(a: Atom) -> None:
    assert atoms_conflict(a, a)


@given(children)
def test_a_gpu_conflicts_with_all_its_children(child: Atom) -> None:
    assert atoms_conflict(whole(child.gpu_uuid), child)


@given(children, children)
def test_distinct_children_do_not_conflict(a: Atom, b: Atom) -> None:
    if a.atom_id != b.atom_id:
        assert not atoms_conflict(a, b)


@given(atoms, atoms)
def test_atoms_of_different_gpus_never_conflict(a: Atom, b: Atom) -> None:
    if a.gpu_uuid != b.gpu_uuid:
        assert not atoms_conflict(a, b)


def test_mig_and_slot_of_one_gpu_coexist() -> None:
    assert not atoms_conflict(mig(UUID, 1, 0), slot(UUID, 0))
    assert atoms_conflict(whole(UUID), mig(UUID, 1, 0))
    assert atoms_conflict(slot(UUID, 0), whole(UUID))
