"""The gateway counts what it did (bc.gateway.counters): sessions opened, streams refused, status written."""

from __future__ import annotations

from tests.integration.conftest import InprocLab


async def test_a_node_that_connects_and_reports_is_counted(lab: InprocLab) -> None:
    counters = lab.server.gateway.counters
    assert counters.snapshot() == (0, 0, 0, 0)
    await lab.join("n1")
    await lab.start_node("n1")
    await lab.wait_connected("n1")
    await lab.wait_observed("n1", 1)
    assert counters.sessions_opened == 1
    assert counters.status_written >= 1  # the report that said generation 1 is observed
    assert counters.streams_refused == 0 and counters.hellos_waited == 0
    line = counters.line(lab.server.gateway.gateway_id, len(lab.server.gateway.sessions))
    assert "sessions=1 sessions_opened=1 streams_refused=0" in line
