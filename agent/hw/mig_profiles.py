"""The MIG profiles a GPU offers, by model: pure data and the one layout rule both the converger and the fake use.

A profile `<g>g.<m>gb` takes `g` of the GPU's 7 compute slices and a share of
its 8 memory slices. A layout (a list of profile names, one GPU instance with
one full compute instance each) fits when the compute and memory slices it
takes add up to at most what the GPU has. The driver's placement rules are
stricter (where each instance may start), so `nvidia-smi mig -cgi` can still
refuse a layout that passes here; that is an apply failure, retried, and the
unit is rolled back (agent.converge.host_units.mig).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

COMPUTE_SLICES = 7
MEMORY_SLICES = 8


@dataclass(frozen=True)
class MigProfile:
    name: str
    compute: int  # compute slices out of 7
    memory: int  # memory slices out of 8


def _table(*rows: tuple[str, int, int]) -> dict[str, MigProfile]:
    return {name: MigProfile(name, c, m) for name, c, m in rows}


_A100_80 = _table(
    ("1g.10gb", 1, 1), ("1g.20gb", 1, 2), ("2g.20gb", 2, 2), ("3g.40gb", 3, 4), ("4g.40gb", 4, 4), ("7g.80gb", 7, 8)
)
_A100_40 = _table(
    ("1g.5gb", 1, 1), ("1g.10gb", 1, 2), ("2g.10gb", 2, 2), ("3g.20gb", 3, 4), ("4g.20gb", 4, 4), ("7g.40gb", 7, 8)
)
_H100_80 = _table(
    ("1g.10gb", 1, 1), ("1g.20gb", 1, 2), ("2g.20gb", 2, 2), ("3g.40gb", 3, 4), ("4g.40gb", 4, 4), ("7g.80gb", 7, 8)
)
_H100_94 = _table(
    ("1g.12gb", 1, 1), ("1g.24gb", 1, 2), ("2g.24gb", 2, 2), ("3g.47gb", 3, 4), ("4g.47gb", 4, 4), ("7g.94gb", 7, 8)
)
_H200_141 = _table(
    ("1g.18gb", 1, 1), ("1g.35gb", 1, 2), ("2g.35gb", 2, 2), ("3g.71gb", 3, 4), ("4g.71gb", 4, 4), ("7g.141gb", 7, 8)
)

# Matched against the GPU's name in order: the first key the name contains wins.
_MODELS: tuple[tuple[str, dict[str, MigProfile]], ...] = (
    ("A100-SXM4-80GB", _A100_80),
    ("A100 80GB", _A100_80),
    ("A100-PCIE-80GB", _A100_80),
    ("A100", _A100_40),
    ("H100 NVL", _H100_94),
    ("H100", _H100_80),
    ("H200", _H200_141),
)


def profiles_for(gpu_name: str) -> dict[str, MigProfile]:
    """The profiles a GPU model offers by name; empty for a GPU without MIG (an L4, an RTX)."""
    for key, table in _MODELS:
        if key in gpu_name:
            return table
    return {}


def layout_problem(gpu_name: str, layout: Sequence[str]) -> str | None:
    """Why a layout cannot be made on this GPU model (one sentence), or None when it fits."""
    offered = profiles_for(gpu_name)
    if not offered:
        return f"{gpu_name} does not support MIG"
    compute = memory = 0
    for name in layout:
        p = offered.get(name)
        if p is None:
            return f"{gpu_name} does not offer MIG profile {name!r} (it offers {', '.join(offered)})"
        compute += p.compute
        memory += p.memory
    if compute > COMPUTE_SLICES or memory > MEMORY_SLICES:
        return (
            f"MIG layout {', '.join(layout)} needs {compute} compute and {memory} memory slices;"
            f" {gpu_name} has {COMPUTE_SLICES} and {MEMORY_SLICES}"
        )
    return None
