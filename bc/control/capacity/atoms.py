"""Capacity placement: which atoms a node offers, which are free, where a hold fits.

Pure functions over a node's reported inventory and the atoms already booked
on it, so the capacity worker, the simulator and the tests compute the same
placement from the same facts. Placement is deterministic (GPU index, then
the atom's numbers) rather than clever: the same inputs always give the same
atoms, which keeps a re-placement after a restart stable and the simulator
replayable. Conflicts are the parent-aware rule of `bc.protocol.atoms`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from bc.protocol.atoms import DEVICE_CLASSES, GPU, GPU_MIG, GPU_SLOT, Atom, atoms_conflict, parse_atom
from bc.protocol.pb import common_pb2

Candidate = tuple[str, common_pb2.Inventory, Sequence[Atom]]
"""A node to place on: its id, its inventory and the atoms already booked on it."""


@dataclass(frozen=True)
class NodeFacts:
    """What decides whether a node may take a new hold at all, before its capacity is looked at."""

    node_id: str
    role: str
    cordoned: bool
    connectivity: str  # new | connected | disconnected | unreachable
    revoked: bool


def refusal(node: NodeFacts, *, named: bool) -> str | None:
    """Why `node` cannot take a new hold, as a sentence; None when it can.

    A revoked node never takes one: its agent refuses to dial again, so the hold could never bind. A
    cordoned node takes none by definition. Chosen automatically, a node must also be connected now:
    a hold placed on a node that is away binds only when it comes back, while a connected one would
    have bound it at once. Named with `--node`, a node that is merely away is the operator's choice,
    and the hold is delivered when it reconnects.
    """
    if node.role != "node":
        return f"node {node.node_id} has role {node.role!r}; holds are placed on role 'node' only"
    if node.revoked:
        return f"node {node.node_id} is revoked; it can never bind a hold"
    if node.cordoned:
        return f"node {node.node_id} is cordoned"
    if not named and node.connectivity != "connected":
        return f"node {node.node_id} is {node.connectivity}"
    return None


def _check_class(device_class: str) -> None:
    if device_class not in DEVICE_CLASSES:
        raise ValueError(f"unknown device class {device_class!r}; classes are {', '.join(DEVICE_CLASSES)}")


class MigLike(Protocol):
    """A MIG instance as inventory reports it (the protobuf message or the planner's dataclass)."""

    @property
    def gi(self) -> int: ...
    @property
    def ci(self) -> int: ...


class GpuLike(Protocol):
    """A GPU as inventory reports it: what offering atoms reads, so one rule serves protobuf and plain facts."""

    @property
    def index(self) -> int: ...
    @property
    def uuid(self) -> str: ...
    @property
    def healthy(self) -> bool: ...
    @property
    def mig_enabled(self) -> bool: ...
    @property
    def mig_instances(self) -> Iterable[MigLike]: ...
    @property
    def slots(self) -> int: ...


def offered_atoms(inventory: common_pb2.Inventory, device_class: str) -> list[Atom]:
    """Every atom of the class the node offers, booked or not, in placement order (see `offered_atoms_of`)."""
    return offered_atoms_of(inventory.gpus, device_class)


def offered_atoms_of(gpus: Iterable[GpuLike], device_class: str) -> list[Atom]:
    """Every atom of the class these GPUs offer, booked or not, in placement order.

    Only healthy GPUs offer anything, and none a GPU-level cordon took out of placement (a `cordoned` GPU:
    the planner's facts carry it, an inventory never does). A MIG-enabled GPU offers its MIG
    instances and nothing else; any other GPU offers itself whole and, when
    it has shared slots, `<uuid>/s0 … s<slots-1>`. A GPU whose UUID cannot
    be an atom id (say, with a `_`) offers nothing.
    """
    _check_class(device_class)
    keyed: list[tuple[int, tuple[int, ...], Atom]] = []
    for gpu in gpus:
        if not gpu.healthy or not gpu.uuid or getattr(gpu, "cordoned", False):
            continue
        ids: list[str] = []
        if device_class == GPU and not gpu.mig_enabled:
            ids = [gpu.uuid]
        elif device_class == GPU_MIG and gpu.mig_enabled:
            ids = [f"{gpu.uuid}/{m.gi}/{m.ci}" for m in gpu.mig_instances]
        elif device_class == GPU_SLOT and not gpu.mig_enabled and gpu.slots > 0:
            ids = [f"{gpu.uuid}/s{n}" for n in range(gpu.slots)]
        try:
            atoms = [parse_atom(device_class, i) for i in ids]
        except ValueError:
            continue  # a UUID no atom id can name is not bookable; one odd GPU must not break placement
        keyed.extend((gpu.index, a.numbers, a) for a in atoms)
    keyed.sort(key=lambda k: (k[0], k[2].gpu_uuid, k[1]))
    return [a for _, _, a in keyed]


def free_atoms(inventory: common_pb2.Inventory, booked: Sequence[Atom], device_class: str) -> list[Atom]:
    """The offered atoms of the class that conflict with no booked atom, in placement order."""
    return [a for a in offered_atoms(inventory, device_class) if not any(atoms_conflict(a, b) for b in booked)]


def free_among(offered: Sequence[Atom], booked: Iterable[Atom]) -> list[Atom]:
    """The offered atoms that conflict with no booked atom, in their order: `free_atoms` without the inventory.

    The same parent-aware rule as `atoms_conflict`, by set lookups, so a node with many bookings costs
    one pass over them rather than one per offered atom.
    """
    ids: set[str] = set()
    whole: set[str] = set()  # GPUs booked whole: nothing on them is free
    parts: set[str] = set()  # GPUs with any atom booked: they are not free whole
    for b in booked:
        ids.add(b.atom_id)
        parts.add(b.gpu_uuid)
        if b.is_whole_gpu:
            whole.add(b.gpu_uuid)
    return [
        a
        for a in offered
        if a.atom_id not in ids and a.gpu_uuid not in whole and not (a.is_whole_gpu and a.gpu_uuid in parts)
    ]


def place(inventory: common_pb2.Inventory, booked: Sequence[Atom], device_class: str, count: int) -> list[Atom] | None:
    """The first `count` free atoms of the class, or None when the node has fewer.

    Free atoms of one class never conflict with each other (distinct ids,
    and whole GPUs of distinct UUIDs), so the first `count` are a valid hold.
    """
    if count < 1:
        raise ValueError(f"a placement needs at least one atom, not {count}")
    free = free_atoms(inventory, booked, device_class)
    return free[:count] if len(free) >= count else None


def choose_node(candidates: Sequence[Candidate], device_class: str, count: int) -> tuple[str, list[Atom]] | None:
    """The node with the most free atoms of the class that fits `count` (ties: lowest node id)."""
    if count < 1:
        raise ValueError(f"a placement needs at least one atom, not {count}")
    best: tuple[int, str, list[Atom]] | None = None
    for node_id, inventory, booked in candidates:
        free = free_atoms(inventory, booked, device_class)
        if len(free) < count:
            continue
        if best is None or (-len(free), node_id) < (-best[0], best[1]):
            best = (len(free), node_id, free[:count])
    return None if best is None else (best[1], best[2])
