"""The model and the scheduler stay pure: they import no I/O, no clock, no asyncio, no store.

The persisted scheduler, the simulator and the property tests all drive the same `step`; a clock read or a
store call inside it would make a replay depend on more than its events.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
PURE = ("bc/jobs/model.py", "bc/jobs/scheduler.py")
ALLOWED = {"__future__", "collections.abc", "dataclasses", "enum", "re", "bc.errors", "bc.jobs.model"}


def imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
    return out


@pytest.mark.parametrize("module", PURE)
def test_pure_modules_import_only_pure_things(module: str) -> None:
    assert imports(ROOT / module) <= ALLOWED, imports(ROOT / module) - ALLOWED
