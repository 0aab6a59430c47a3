"""The `event=gateway.stats` line: what a gateway did, as an operator greps it."""

from __future__ import annotations

from bc.gateway.counters import GatewayCounters


def test_the_line_names_every_counter_and_the_open_sessions() -> None:
    c = GatewayCounters()
    c.sessions_opened += 3
    c.status_written += 7
    assert c.line("gw-a", 2) == (
        "event=gateway.stats gateway=gw-a sessions=2 sessions_opened=3 streams_refused=0 status_written=7"
        " hellos_waited=0"
    )


def test_a_snapshot_changes_when_any_counter_does() -> None:
    c = GatewayCounters()
    before = c.snapshot()
    c.streams_refused += 1
    assert c.snapshot() != before
