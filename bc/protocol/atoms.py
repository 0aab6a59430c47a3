"""Device atoms: the units of GPU capacity a hold books and a node binds.

The control plane places reservations on atoms and the agent binds them, so
both ends must agree on what an atom id means and when two atoms overlap.
That agreement lives here, pure and shared.

    class      atom id                   resolves to (on the node)
    gpu        <GPU UUID>                the GPU itself
    gpu.mig    <GPU UUID>/<gi>/<ci>      the MIG instance's MIG-… UUID
    gpu.slot   <GPU UUID>/s<n>           its GPU (shared through MPS)

Ids are canonical (decimal numbers without leading zeros) so that one atom
has exactly one spelling: two spellings of the same instance would slip past
the conflict check. GPU UUIDs may not contain `/` or `_`, which keeps
`cdi_name` (the id with `/` as `_`) one-to-one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

GPU = "gpu"
GPU_MIG = "gpu.mig"
GPU_SLOT = "gpu.slot"
DEVICE_CLASSES: tuple[str, ...] = (GPU, GPU_MIG, GPU_SLOT)
"""Every device class a DeviceRef may name."""

CDI_KIND = "bc.dev/gpu"
"""The CDI `vendor.domain/class` kind of every device the agent writes."""

_UUID = r"[A-Za-z0-9][A-Za-z0-9.:-]*"
_NUM = r"(?:0|[1-9][0-9]*)"
_GPU_RE = re.compile(rf"({_UUID})")
_MIG_RE = re.compile(rf"({_UUID})/({_NUM})/({_NUM})")
_SLOT_RE = re.compile(rf"({_UUID})/s({_NUM})")
_PATTERNS: dict[str, re.Pattern[str]] = {GPU: _GPU_RE, GPU_MIG: _MIG_RE, GPU_SLOT: _SLOT_RE}
_SHAPES = {GPU: "<GPU UUID>", GPU_MIG: "<GPU UUID>/<gi>/<ci>", GPU_SLOT: "<GPU UUID>/s<n>"}


@dataclass(frozen=True, order=True)
class Atom:
    """One bookable unit of a GPU: the whole GPU, a MIG instance or a shared slot."""

    device_class: str
    gpu_uuid: str
    atom_id: str

    @property
    def is_whole_gpu(self) -> bool:
        return self.device_class == GPU

    @property
    def numbers(self) -> tuple[int, ...]:
        """The numeric parts of the id: (gi, ci) for MIG, (n,) for a slot, () for a GPU."""
        if self.device_class == GPU_MIG:
            _, gi, ci = self.atom_id.split("/")
            return (int(gi), int(ci))
        if self.device_class == GPU_SLOT:
            return (int(self.atom_id.rsplit("/s", 1)[1]),)
        return ()


def parse_atom(device_class: str, atom_id: str) -> Atom:
    """The atom a DeviceRef names; ValueError when the class is unknown or the id has the wrong shape."""
    pattern = _PATTERNS.get(device_class)
    if pattern is None:
        raise ValueError(f"unknown device class {device_class!r}; classes are {', '.join(DEVICE_CLASSES)}")
    m = pattern.fullmatch(atom_id)
    if m is None:
        raise ValueError(
            f"{atom_id!r} is not a {device_class} atom id; expected {_SHAPES[device_class]} "
            "(GPU UUID of A-Z a-z 0-9 . : -, numbers without leading zeros)"
        )
    return Atom(device_class, m.group(1), atom_id)


def infer_atom(atom_id: str) -> Atom:
    """The atom an id names, its class read from the id's shape (the shapes never overlap).

    The agent reads holds back from CDI annotations that carry only the id.
    """
    for device_class in DEVICE_CLASSES:
        if _PATTERNS[device_class].fullmatch(atom_id):
            return parse_atom(device_class, atom_id)
    raise ValueError(f"{atom_id!r} is not an atom id of any device class")


def atoms_conflict(a: Atom, b: Atom) -> bool:
    """Whether two holds could not both have these atoms.

    Parent-aware: a whole GPU overlaps every atom of that GPU (and the GPU
    itself); a MIG instance or a slot overlaps its GPU and itself only.
    """
    if a.gpu_uuid != b.gpu_uuid:
        return False
    return a.atom_id == b.atom_id or a.is_whole_gpu or b.is_whole_gpu


def cdi_name(atom_id: str) -> str:
    """The CDI device name of an atom: CDI names allow only A-Za-z0-9-_.: so `/` becomes `_`."""
    return atom_id.replace("/", "_")


def cdi_qualified(atom_id: str) -> str:
    """The fully qualified CDI device name, `bc.dev/gpu=<name>`, as reported in AllocationBound."""
    return f"{CDI_KIND}={cdi_name(atom_id)}"
