"""The Fleet screen against a real `bc serve` with fake nodes: spec changes, disconnects and reconnects."""

from __future__ import annotations

import json

from bc.runtime.config import OperatorConfig
from tests.integration.conftest import InprocLab
from tests.tui.conftest import SIZE, make_app, until
from tui.fleet_table import FleetTable


def cell(app: object, node: str, column: str) -> str:
    table = app.screen.query_one(FleetTable)  # type: ignore[attr-defined]
    return str(table.get_cell(node, column))


async def test_the_fleet_table_follows_a_spec_change_a_disconnect_and_a_reconnect(lab: InprocLab) -> None:
    for n in ("n1", "n2"):
        await lab.join(n)
        await lab.start_node(n)
        await lab.wait_connected(n)
    app = make_app(OperatorConfig.load(lab.server.operator_config))
    async with app.run_test(size=SIZE) as pilot:
        table = app.screen.query_one(FleetTable)
        await until(pilot, lambda: table.row_count == 2 and cell(app, "n2", "conn").startswith("connected"))
        # The cursor sits on n2; updates to n1 must not move it.
        await pilot.press("down")
        assert table.current_node() == "n2"
        gen = int(cell(app, "n1", "gen").split("/")[0])
        await lab.admin.set_spec_section("n1", "telemetry", json.dumps({"export_interval_s": 42}))
        want = f"{gen + 1}/{gen + 1}/{gen + 1}"
        await until(pilot, lambda: cell(app, "n1", "gen") == want, what="the new generation, applied and observed")
        assert table.current_node() == "n2" and table.get_row_index("n1") == 0

        await lab.stop_node("n1")
        await until(pilot, lambda: cell(app, "n1", "conn").startswith("disconnected"))
        assert table.current_node() == "n2"
        await lab.start_node("n1")
        await until(pilot, lambda: cell(app, "n1", "conn").startswith("connected"))
        # The lanes and GPUs are known (no n/a) once the snapshot and the node's detail are read.
        assert cell(app, "n1", "lanes") == "0/0/0"
        await until(pilot, lambda: cell(app, "n1", "gpus") == "0/8")
        await pilot.press("q")
