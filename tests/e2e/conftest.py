"""The `lab` fixture: one `Lab` per test, always torn down, its logs shown when a test fails."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from .harness import Lab


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Lab]:
    lb = Lab(tmp_path)
    try:
        yield lb
    finally:
        lb.close()
        # Captured output of the teardown is printed only for a failing test.
        print(lb.dump_logs())
