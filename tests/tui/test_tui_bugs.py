"""Issue 30's TUI bugs, one pilot test each, on the seeded source: the events filter cleared without
duplicating rows, a node's no-schedule reasons kept as the server has them, pending quorum changes on the
Approvals screen, columns sized to the terminal, and an active filter shown."""

from __future__ import annotations

import random

from textual.widgets import DataTable, RichLog, Static

from bc.protocol.pb import admin_pb2
from tests.tui.conftest import SIZE, until
from tui.app import BcTui
from tui.fake import FakeSource, FrozenClock
from tui.fleet_table import FleetTable
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


async def test_an_event_that_arrives_while_filtered_is_shown_once_and_clearing_shows_every_event_once() -> None:
    source = FakeSource(random.Random(7), nodes=8)
    app = app_on(source)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.state.link.live and len(app.state.events) > 0)
        await pilot.press("6")
        await until(pilot, lambda: isinstance(app.screen, EventsScreen))
        log = app.screen.query_one(RichLog)
        await pilot.press("slash", *"gpu-0003", "enter")
        shown = len(log.lines)
        source.publish("node.labelled", "gpu-0003", '{"set": {"rack": "r9"}}')
        await until(pilot, lambda: len(app.state.events) == 13)
        await pilot.pause(0.2)
        assert len(log.lines) == shown + 1, "the new event once"
        await pilot.press("escape")
        await pilot.pause(0.2)
        assert len(log.lines) == len(app.state.events) == 13


async def test_the_events_filter_in_force_is_on_screen_and_offered_to_edit() -> None:
    source = FakeSource(random.Random(7), nodes=8)
    app = app_on(source)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.state.link.live and len(app.state.events) > 0)
        await pilot.press("6")
        await until(pilot, lambda: isinstance(app.screen, EventsScreen))
        status = app.screen.query_one("#events-status", Static)
        await pilot.press("slash", *"node.", "enter")
        await pilot.pause(0.2)
        assert "filter: 'node.' (9 of 12 events shown)" in str(status.render())
        await pilot.press("slash")
        assert app.screen.query_one("#events-filter").value == "node."  # type: ignore[attr-defined]
        await pilot.press("escape")
        await pilot.pause(0.2)
        assert "filter" not in str(status.render()).split("·")[0]


async def test_a_node_s_no_schedule_reasons_stay_as_the_server_has_them_across_polls() -> None:
    source = FakeSource(random.Random(7), nodes=8)
    node = source.nodes["gpu-0002"]
    del node.no_schedule[:]
    node.no_schedule.append("new")
    app = app_on(source, poll_s=0.05)
    async with app.run_test(size=SIZE) as pilot:
        table = app.screen.query_one(FleetTable)
        await until(pilot, lambda: app.state.link.live and all(r.detail for r in app.state.rows.values()))
        await pilot.pause(0.5)  # several polls of ListNodes, each merged into the detailed rows
        assert list(app.state.rows["gpu-0002"].info.no_schedule) == ["new"]
        await until(pilot, lambda: str(table.get_cell("gpu-0002", "sched")) == "new", what="one reason, once")
        # A reason the server cleared goes from the row too.
        del node.no_schedule[:]
        await until(pilot, lambda: str(table.get_cell("gpu-0002", "sched")) == "-", what="the reason cleared")


async def test_pending_approver_and_threshold_changes_are_on_the_approvals_screen() -> None:
    source = FakeSource(random.Random(7), nodes=8)
    source.quorum_changes.append(
        admin_pb2.QuorumChangeInfo(
            id="q-0001", state="pending", summary="add approver dave", requested_by="alice", threshold=2,
            approvals=1, created_age_ms=60_000,
        )
    )  # fmt: skip
    source.quorum_changes.append(admin_pb2.QuorumChangeInfo(id="q-0000", state="applied", summary="threshold 2"))
    app = app_on(source)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.state.link.live)
        await pilot.press("2")
        changes = app.screen.query_one("#quorum-changes", DataTable)
        await until(pilot, lambda: changes.row_count == 1, what="the pending change, not the applied one")
        assert [str(c) for c in changes.get_row("q-0001")] == ["q-0001", "add approver dave", "1 of 2", "alice", "1m"]


def long_labels(source: FakeSource) -> str:
    labels = {"pool": "a100-80g-sxm4", "zone": "eu-west-4c", "team": "inference-platform", "rack": "r0042"}
    for n in source.nodes.values():
        n.labels.update(labels)
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


async def test_on_a_wide_terminal_the_labels_are_shown_whole() -> None:
    source = FakeSource(random.Random(7), nodes=8)
    whole = long_labels(source)
    app = app_on(source)
    async with app.run_test(size=(220, 40)) as pilot:
        table = app.screen.query_one(FleetTable)
        await until(pilot, lambda: app.state.link.live and table.row_count == 8)
        assert str(table.get_cell("gpu-0001", "labels")) == whole


async def test_on_a_narrow_terminal_the_table_fits_and_shrinks_back_after_a_wide_one() -> None:
    source = FakeSource(random.Random(7), nodes=8)
    whole = long_labels(source)
    app = app_on(source)
    async with app.run_test(size=(220, 40)) as pilot:
        table = app.screen.query_one(FleetTable)
        await until(pilot, lambda: app.state.link.live and table.row_count == 8)
        await pilot.resize_terminal(120, 40)
        await until(pilot, lambda: str(table.get_cell("gpu-0001", "labels")) != whole, what="clipped to fit")
        cell = str(table.get_cell("gpu-0001", "labels"))
        assert cell.endswith("…") and whole.startswith(cell[:-1])
        await pilot.pause(0.2)
        assert table.virtual_size.width <= 120, "every column on screen, none scrolled off"


async def test_a_batch_s_what_is_shown_whole_when_the_terminal_has_room() -> None:
    source = FakeSource(random.Random(7), nodes=8)
    app = app_on(source)
    async with app.run_test(size=(200, 40)) as pilot:
        await until(pilot, lambda: app.state.link.live)
        await pilot.press("2")
        batches = app.screen.query_one("#batches", DataTable)
        await until(pilot, lambda: batches.row_count == 1)
        assert str(batches.get_row("b-0001")[1]) == "3 node(s) × gpu.reset; payload digest abababababababab…"


async def test_the_fleet_filter_in_force_is_on_screen_and_offered_to_edit() -> None:
    source = FakeSource(random.Random(7), nodes=40)
    app = app_on(source)
    async with app.run_test(size=SIZE) as pilot:
        table = app.screen.query_one(FleetTable)
        await until(pilot, lambda: app.state.link.live and table.row_count == 40)
        status = app.screen.query_one("#fleet-status", Static)
        assert "filter" not in str(status.render())
        await pilot.press("slash", *"r01", "enter")  # racks of 32: gpu-0032..0039
        await until(pilot, lambda: table.row_count == 8)
        assert "filter: 'r01' (8 shown)" in str(status.render())
        await pilot.press("slash")
        assert app.screen.query_one("#fleet-filter").value == "r01"  # type: ignore[attr-defined]
        await pilot.press("escape")
        await until(pilot, lambda: table.row_count == 40)
        assert "filter" not in str(status.render())


async def test_a_tick_between_a_mode_switch_and_the_new_screen_s_compose_does_not_stop_the_app() -> None:
    """CI saw the TUI freeze after pressing a screen's key: the second's tick (and a link change) reached the
    new screen before it had composed its banner, and the exception ended the app's message loop."""
    source = FakeSource(random.Random(7), nodes=4)
    app = app_on(source)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.state.link.live)
        for mode in ("health", "events", "jobs"):  # each one new: its screen made on the switch
            app.switch_mode(mode)
            assert not app.screen.is_mounted  # the moment the race needs: current, not yet composed
            app._tick()
            app._link_changed()
            await until(pilot, lambda: app.screen.is_mounted, what=f"the {mode} screen mounted")
        await pilot.press("6")
        await until(pilot, lambda: isinstance(app.screen, EventsScreen), what="the app still answers keys")
    assert app._exception is None
