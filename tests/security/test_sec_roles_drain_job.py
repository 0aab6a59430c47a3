"""Attack: an operator runs `bc jobs run drain`, whose first step cordons the node, which is admin-only as a
direct command (`bc nodes cordon`). A job needs the role of its most privileged step: refused exit 6 with the
role named, and nothing stored (no job, the node not cordoned)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.test_cli_cmd import ok_json
from tests.integration.test_quorum_cli import as_operator, refused
from tests.security.roles_helpers import Lab, jobs, operator_config, serve_lab


@pytest.fixture
def lab(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Lab]:
    yield from serve_lab(tmp_path, monkeypatch)


def test_an_operator_cannot_drain_a_node_through_a_job(lab: Lab, tmp_path: Path) -> None:
    carol = operator_config(tmp_path, "carol", role="operator")
    refused(
        as_operator(carol, "jobs", "run", "drain", "n2"),
        6,
        "running a drain job: cordoning a node needs the admin role; operator carol has the operator role",
    )
    assert jobs() == []
    assert ok_json("nodes", "show", "n2")["cordoned"] is False
    # The same refusal as the direct command, which was always admin's.
    refused(as_operator(carol, "nodes", "cordon", "n2"), 6, "cordoning a node needs the admin role")
