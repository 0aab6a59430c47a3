"""Shared by the root-equivalent spec change tests: a lab node, root-equivalent sections, the quorum.

Nothing here imports the code under test beyond the Admin API and the lab
fixtures, so each test fails on a tree without the fix for the reason it
names (the change goes through), not for a missing import.
"""

from __future__ import annotations

import json

from cryptography.hazmat.primitives.asymmetric import ed25519

from bc.pki import ssh as ssh_pki
from tests.integration.conftest import InprocLab
from tests.integration.operators_lab import Approver
from tests.integration.test_compromised_gateway import until

OWN_CA = ssh_pki.public_line(ed25519.Ed25519PrivateKey.generate())
"""An SSH CA an operator made on their own machine."""


async def node(lab: InprocLab, node_id: str = "n1") -> None:
    """A joined, connected node that has taken its first spec."""
    await lab.join(node_id)
    await lab.start_node(node_id)
    await lab.wait_connected(node_id)
    await lab.wait_observed(node_id, 1)


async def generation(lab: InprocLab, node_id: str = "n1") -> int:
    return int((await lab.admin.get_spec(node_id)).generation)


async def holds_approvers(lab: InprocLab, n: int, node_id: str = "n1") -> None:
    """Wait until the node's trust bundle holds the `n` approvers (pushed within a second of each change)."""
    await until(lambda: len(lab.agents[node_id].trust.bundle.approver_keys) == n)


def host(units: dict[str, dict[str, object]]) -> str:
    return json.dumps({"units": [{"name": k, "settings_json": json.dumps(v)} for k, v in units.items()]})


__all__ = ["OWN_CA", "Approver", "generation", "holds_approvers", "host", "node"]
