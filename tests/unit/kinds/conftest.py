"""The `node` fixture of the command kind tests: a fake hgx-h100-8 node over tmp dirs."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.kinds.kind_helpers import FakeNode


@pytest.fixture
def node(tmp_path: Path) -> FakeNode:
    return FakeNode(tmp_path)
