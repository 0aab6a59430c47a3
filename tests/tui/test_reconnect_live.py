"""The banner when `bc serve` goes away, and a resume from the cursor with no event lost or shown twice."""

from __future__ import annotations

from bc.config import OperatorConfig
from bc.serve import Seams, ServeOptions, Server
from tests.integration.conftest import InprocLab
from tests.tui.conftest import SIZE, make_app, until
from tui.fleet_table import FleetTable
from tui.widgets import Banner


def banner(app: object) -> str:
    b = app.screen.query_one(Banner)  # type: ignore[attr-defined]
    return str(b.render()) if b.has_class("shown") else ""


async def test_the_banner_shows_while_bc_serve_is_down_and_the_stream_resumes_without_gap_or_duplicate(
    lab: InprocLab,
) -> None:
    await lab.join("n1")
    await lab.start_node("n1")
    await lab.wait_connected("n1")
    cfg = OperatorConfig.load(lab.server.operator_config)
    app = make_app(cfg)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.state.link.live and "n1" in app.state.rows)
        await lab.admin.label_node("n1", {"rack": "r1"}, [])
        await until(pilot, lambda: any(e.type == "node.labelled" for e in app.state.events))
        first = app.state.events[0].seq if app.state.events else app.state.cursor
        assert banner(app) == ""

        address = lab.server.address
        await lab.stop_node("n1")
        await lab.server.stop()
        await until(pilot, lambda: "not answering" in banner(app), what="the banner")
        assert "stale" in banner(app) and address in banner(app)

        opts = ServeOptions(data_dir=lab.root / "server", listen=address, heartbeat_interval_s=1.0)
        server = Server(opts, Seams.production())
        await server.start()
        lab.server = server
        await lab.start_node("n1")
        await until(pilot, lambda: app.state.link.live and banner(app) == "", what="the banner goes")
        await lab.admin.label_node("n1", {"rack": "r2"}, [])
        await until(pilot, lambda: any(e.type == "node.labelled" and "r2" in e.data_json for e in app.state.events))
        table = app.screen.query_one(FleetTable)
        await until(pilot, lambda: str(table.get_cell("n1", "labels")) == "rack=r2", what="the row after the resume")
        await pilot.press("q")

    log = await lab.admin.list_events(after_seq=first - 1, limit=1000)
    on_screen = [e.seq for e in app.state.events if e.seq >= first]
    upto = on_screen[-1]
    assert on_screen == [e.seq for e in log if e.seq <= upto], "every event once, in order"
