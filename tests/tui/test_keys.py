"""Keyboard paths on the seeded source: filter, sort, jump, the cursor staying on its node under updates,
the palette, and a cordon from the Node screen only after confirmation."""

from __future__ import annotations

import random

from textual.pilot import Pilot

from tests.tui.conftest import SIZE, until
from tui.app import BcTui
from tui.fake import FakeSource, FrozenClock
from tui.fleet_table import FleetTable
from tui.screens.node import NodeScreen
from tui.widgets import ConfirmScreen


async def started(source: FakeSource, pilot: Pilot[None], app: BcTui) -> FleetTable:
    table = app.screen.query_one(FleetTable)
    await until(pilot, lambda: app.state.link.live and table.row_count == len(source.nodes))
    return table


async def test_filter_sort_jump_and_the_cursor_stays_on_its_node_while_rows_update() -> None:
    source = FakeSource(random.Random(7), nodes=40)
    app = BcTui(source.connect, FrozenClock(), server="fake:0", poll_s=3600.0, tick_s=0)
    async with app.run_test(size=SIZE) as pilot:
        table = await started(source, pilot, app)
        await pilot.press("g", *"gpu-0007", "enter")
        assert table.current_node() == "gpu-0007"
        # Updates to other rows, and to its own, leave the cursor and the order as they are.
        before = [str(r.key.value) for r in table.ordered_rows]
        for n in ("gpu-0000", "gpu-0007", "gpu-0030"):
            source.nodes[n].state = "disconnected"
            source.publish("node.connectivity", n, '{"state": "disconnected"}')
        await until(pilot, lambda: str(table.get_cell("gpu-0030", "conn")).startswith("disconnected"))
        assert table.current_node() == "gpu-0007" and [str(r.key.value) for r in table.ordered_rows] == before

        await pilot.press("slash", *"r01", "enter")  # racks of 32: gpu-0032..0039
        assert table.row_count == 8 and all(str(r.key.value) >= "gpu-0032" for r in table.ordered_rows)
        await pilot.press("escape")
        assert table.row_count == 40 and table.current_node() == "gpu-0007"  # back on its node

        await pilot.press("s")  # by connectivity, then by id
        order = [(app.state.rows[str(r.key.value)].info.state, str(r.key.value)) for r in table.ordered_rows]
        assert order == sorted(order) and len({s for s, _ in order}) > 1
        assert table.current_node() == "gpu-0007"


async def test_the_palette_finds_a_node_and_cordon_asks_first() -> None:
    source = FakeSource(random.Random(7), nodes=12)
    app = BcTui(source.connect, FrozenClock(), server="fake:0", poll_s=3600.0, tick_s=0)
    async with app.run_test(size=SIZE) as pilot:
        await started(source, pilot, app)
        await pilot.press("ctrl+p", *"node gpu-0005")
        await pilot.pause(0.5)
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, NodeScreen))
        assert isinstance(app.screen, NodeScreen) and app.screen.node_id == "gpu-0005"
        was = source.nodes["gpu-0005"].cordoned
        await pilot.press("c")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        await pilot.press("n")  # no: nothing changes
        await until(pilot, lambda: isinstance(app.screen, NodeScreen))
        assert source.nodes["gpu-0005"].cordoned == was
        await pilot.press("c")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        await pilot.press("y")
        await until(pilot, lambda: source.nodes["gpu-0005"].cordoned)
        await pilot.press("escape")
        await until(pilot, lambda: app.screen.query(FleetTable).first() is not None)
