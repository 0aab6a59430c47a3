"""Attack: a copy of a node's files (a disk image, a retired host) taken while its certificate was still
valid; once the certificate has expired, the thief re-joins with the copied key. docs/security.md says
what that buys: one re-join, within 7 days of the expiry, and only while the copied certificate is the
identity's latest; after that the real node's own re-join is refused, and shows as an event. A revoked
certificate (`bc nodes revoke`) re-joins nothing, copy or not. Real `bc serve` over gRPC, its clock
stepped past the expiry (tests/integration/test_rejoin.py's lab)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from bc.errors import Unauthenticated

# The fixtures of the re-join tests (a lab whose clock starts two days back, on SQLite and PostgreSQL).
from tests.integration.conftest import store_url  # noqa: F401
from tests.integration.test_rejoin import PastLab, _reasons, _renewer, back_days, past, roles  # noqa: F401


async def test_a_stolen_copy_rejoins_once_and_the_real_nodes_rejoin_then_shows_it(
    past: PastLab,  # noqa: F811 (the fixture imported above)
    tmp_path: Path,
) -> None:
    lab = past.lab
    await lab.join("n1")
    real = lab.node_dir("n1")
    stolen = tmp_path / "stolen"
    shutil.copytree(real, stolen)
    past.to_present()

    await _renewer(stolen).rejoin_once()  # the thief is first: it works, once
    with pytest.raises(Unauthenticated, match="not the node's latest certificate"):
        await _renewer(real).rejoin_once()
    assert await _reasons(lab) == ["rejoin:not-latest"], "the real node's refusal is in the event log"
    ev = (await lab.admin.list_events(type_prefix="security.rejoin.refused"))[0]
    assert ev.subject == "n1" and json.loads(ev.data_json)["reason"] == "rejoin:not-latest"

    # The operator revokes the node: the thief's new certificate and every other one are done.
    await lab.admin.revoke_node("n1", reason="stolen disk")
    with pytest.raises(Unauthenticated, match="was revoked"):
        await _renewer(real).rejoin_once()
