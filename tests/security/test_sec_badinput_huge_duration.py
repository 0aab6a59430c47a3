"""Attack: `bc reserve --duration 106751991167d` (and the same straight through the Admin API, as a script
would call it) used to store a reservation whose end does not fit an int64, after which every placement
pass raised OverflowError and no reservation could be placed fleet-wide. Now the CLI and the Admin API
refuse it (exit 2 naming the bound from the one limits table), store nothing, and a normal reservation is
placed as before. Start times have an upper bound too."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from bc.client.admin import AdminClient
from bc.errors import UsageError
from bc.protocol.pb import admin_pb2
from bc.runtime.config import OperatorConfig
from tests.integration.test_capacity_cli import connected_with_gpus
from tests.integration.test_cli_cmd import bc, ok_json
from tests.integration.test_quorum_cli import Lab, running_lab

DAY_MS = 86_400_000
HUGE_MS = 106751991167 * DAY_MS


@pytest.fixture
def lab(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Lab]:
    yield from running_lab(tmp_path, monkeypatch)


def admin_refusal(lab: Lab, **fields: int) -> str:
    """Reserve one GPU on n1 straight through the Admin API; the UsageError's sentence (exit 2)."""

    async def call() -> admin_pb2.Reservation:
        assert lab.server.operator_config is not None
        async with AdminClient(OperatorConfig.load(lab.server.operator_config)) as c:
            return await c.reserve(1, node_id="n1", **fields)

    with pytest.raises(UsageError) as refused:
        lab.run(call())
    assert refused.value.exit_code == 2
    return refused.value.message


def test_a_huge_duration_is_refused_by_the_cli_and_the_admin_api_and_placement_goes_on(lab: Lab) -> None:
    lab.start_node("n1")
    connected_with_gpus(lab, "n1")

    r = bc("reserve", "--gpus", "1", "--node", "n1", "--duration", "106751991167d")
    assert r.exit_code == 2, r.output
    assert r.stderr.startswith("error: ") and "max_duration_ms" in r.stderr and "Traceback" not in r.output
    far = bc("reserve", "--gpus", "1", "--node", "n1", "--start", "2999-01-01T00:00Z")
    assert far.exit_code == 2 and "max_start_ahead_ms" in far.stderr, far.output

    now = lab.now_ms()
    assert "max_duration_ms" in admin_refusal(lab, duration_ms=HUGE_MS)
    assert "max_duration_ms" in admin_refusal(lab, start_ms=now + 3_600_000, duration_ms=HUGE_MS)
    assert "max_duration_ms" in admin_refusal(lab, start_ms=now + 3_600_000, end_ms=2**63 - 1)
    assert "max_start_ahead_ms" in admin_refusal(lab, start_ms=2**63 - 1)
    assert ok_json("reservations", "--all") == [], "a refused reservation was stored"

    placed = ok_json("reserve", "--gpus", "1", "--node", "n1", "--duration", "1h")
    assert (placed["state"], len(placed["devices"])) == ("placed", 1)
