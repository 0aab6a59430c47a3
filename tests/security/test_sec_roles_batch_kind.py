"""Attack: an operator submits a quorum batch of a kind that is admin's (`driver.invoke`, which runs a
provisioning driver as root on the node). The approvers would sign what the batch says, but the batch itself
is the request: a batch needs the role of its kind. Refused exit 6 naming the role; no batch, no command."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from bc.protocol import kinds
from tests.integration.test_quorum_cli import approvers, as_operator, refused
from tests.security.roles_helpers import Lab, operator_config, serve_lab

KIND = "driver.invoke"


@pytest.fixture
def lab(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Lab]:
    yield from serve_lab(tmp_path, monkeypatch)


def test_an_operator_cannot_create_a_batch_of_an_admin_kind(lab: Lab, tmp_path: Path) -> None:
    assert kinds.KINDS[KIND].destructive  # a batch kind (one that runs on the node role, as n1 and n2 are)
    approvers(tmp_path, "alice", "bob")
    carol = operator_config(tmp_path, "carol", role="operator")
    refused(
        as_operator(carol, "batch", "create", "--kind", KIND, "--nodes", "n1,n2", "--reason", "mine"),
        6,
        f"creating a batch of {KIND} needs the admin role; operator carol has the operator role",
    )
    assert lab.batches() == [] and lab.commands() == []
    # Run alone it is refused the same way: the kind's role holds whatever the route.
    refused(as_operator(carol, "cmd", "run", "n1", KIND), 6, f"running {KIND} needs the admin role")
    assert lab.commands() == []
