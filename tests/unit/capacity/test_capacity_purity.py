"""The capacity core stays pure: no I/O, no clock, no randomness, no asyncio, no store.

The pass under its lease, the simulator and the model check all call the same functions; a clock read or a
random draw inside them would make a re-run after a crash give a different plan, and a replay differ.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
PURE = (
    "bc/control/capacity/placement_plan.py",
    "bc/control/capacity/invariants.py",
    "bc/control/capacity/usage_windows.py",
)
ALLOWED = {
    "__future__",
    "bisect",
    "collections.abc",
    "dataclasses",
    "datetime",  # only to print a store-clock instant; reading the clock is refused below
    "itertools",
    "typing",
    "bc.control.capacity.atoms",
    "bc.control.capacity.no_schedule",
    "bc.control.capacity.placement_plan",
    "bc.control.capacity.usage_windows",
    "bc.protocol.atoms",
}
CLOCK_READS = {"now", "utcnow", "today", "time", "monotonic"}


def tree(module: str) -> ast.Module:
    return ast.parse((ROOT / module).read_text(encoding="utf-8"))


@pytest.mark.parametrize("module", PURE)
def test_the_core_imports_only_pure_things(module: str) -> None:
    found: set[str] = set()
    for node in ast.walk(tree(module)):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
    assert found <= ALLOWED, found - ALLOWED


@pytest.mark.parametrize("module", PURE)
def test_the_core_never_reads_a_clock(module: str) -> None:
    calls = [
        n.func.attr
        for n in ast.walk(tree(module))
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in CLOCK_READS
    ]
    assert calls == []
