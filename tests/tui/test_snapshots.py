"""Each screen at 120x40 on seeded data with a frozen clock, compared with the golden SVG in snapshots/.

`export_screenshot()` is Textual's own SVG of the screen. A change to a screen shows here as a
diff of the golden file: run with BC_UPDATE_SNAPSHOTS=1 to write the new ones, and look at them.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from tests.tui.conftest import SIZE, until
from tui.app import BcTui
from tui.fake import FakeSource, FrozenClock
from tui.fleet_table import FleetTable

GOLDEN = Path(__file__).parent / "snapshots"


def app_on(source: FakeSource) -> BcTui:
    return BcTui(source.connect, FrozenClock(), server="fake:0", poll_s=3600.0, tick_s=0)


def compare(name: str, svg: str) -> None:
    path = GOLDEN / f"{name}.svg"
    if os.environ.get("BC_UPDATE_SNAPSHOTS") == "1":
        GOLDEN.mkdir(exist_ok=True)
        path.write_text(svg)
    assert path.exists(), f"no golden {path.name}; run with BC_UPDATE_SNAPSHOTS=1 and look at it"
    assert svg == path.read_text(), f"the {name} screen changed; compare with {path} (BC_UPDATE_SNAPSHOTS=1 rewrites)"


@pytest.mark.parametrize(
    ("name", "keys"),
    [
        ("fleet", []),
        ("fleet_filtered", ["slash", *"zone=a r00", "enter"]),
        ("node", ["enter"]),
        ("approvals", ["2"]),
        ("jobs", ["3"]),
        ("reservations", ["4"]),
        ("commands", ["5"]),
        ("command_open", ["5", "enter"]),
        ("run_command", ["enter", "r"]),
        ("events", ["6"]),
        ("health", ["7"]),
        ("tunnels", ["8"]),
        ("machines", ["9"]),
        ("help", ["question_mark"]),
    ],
)
async def test_each_screen_matches_its_golden_snapshot(name: str, keys: list[str]) -> None:
    source = FakeSource(random.Random(7), nodes=24)
    app = app_on(source)
    async with app.run_test(size=SIZE) as pilot:
        table = app.screen.query_one(FleetTable)
        await until(pilot, lambda: app.state.link.live and table.row_count == 24)
        await until(pilot, lambda: all(r.detail for r in app.state.rows.values()), what="every node's detail read")
        await pilot.press(*keys)
        await pilot.pause(0.3)
        await pilot.wait_for_scheduled_animations()
        compare(name, app.export_screenshot(title=f"bc tui: {name}"))


async def test_the_banner_snapshot_when_the_server_is_gone() -> None:
    source = FakeSource(random.Random(7), nodes=24)
    app = app_on(source)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.state.link.live and all(r.detail for r in app.state.rows.values()))
        await pilot.pause(0.3)
        # What the feed records when the stream breaks, with the frozen clock 42 s later.
        now = app.clock.monotonic()
        app.state.link.live = False
        for t in (40, 39.8, 39.4):  # three failed attempts, the first 40 s ago
            app.state.link.outage.failed("bc serve at fake:0 is not answering (connection refused)", now - t)
        app.state.link.data_at = now - 42
        app.screen.show_link()  # type: ignore[attr-defined]
        app.refresh_bindings()
        await pilot.pause(0.3)
        await pilot.wait_for_scheduled_animations()
        compare("banner", app.export_screenshot(title="bc tui: banner"))
