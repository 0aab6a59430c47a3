"""Issue 30's TUI bugs, one pilot test each, on the seeded source: the events filter cleared without
duplicating rows, a node's no-schedule reasons kept as the server has them, pending quorum changes on the
Approvals screen, columns sized to the terminal, and an active filter shown."""

from __future__ import annotations

import random

from textual.widgets import RichLog

from tests.tui.conftest import SIZE, until
from tui.app import BcTui
from tui.fake import FakeSource, FrozenClock
from tui.screens.events import EventsScreen


def app_on(source: FakeSource, poll_s: float = 3600.0) -> BcTui:
    return BcTui(source.connect, FrozenClock(), server="fake:0", poll_s=poll_s, tick_s=0)


async def test_clearing_the_events_filter_shows_each_event_once() -> None:
    source = FakeSource(random.Random(7), nodes=8)
    app = app_on(source)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.state.link.live and len(app.state.events) > 0)
        await pilot.press("6")
        await until(pilot, lambda: isinstance(app.screen, EventsScreen))
        log = app.screen.query_one(RichLog)
        total = len(app.state.events)
        await until(pilot, lambda: len(log.lines) == total, what="every event once")
        await pilot.press("slash", *"node.", "enter")
        await pilot.pause(0.2)
        await pilot.press("escape")
        await pilot.pause(0.3)
        assert len(log.lines) == total, f"{len(log.lines)} lines for {total} events after clearing the filter"
        await pilot.press("slash", "enter")  # an empty filter submitted: the same
        await pilot.pause(0.3)
        assert len(log.lines) == total
