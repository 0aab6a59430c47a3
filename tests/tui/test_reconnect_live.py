"""The banner when `bc serve` goes away, and a resume from the cursor with no event lost or shown twice."""

from __future__ import annotations

import asyncio

from textual.widgets import Static

from bc.assembly.server import Seams, ServeOptions, Server
from bc.protocol.pb import admin_pb2
from bc.runtime.config import OperatorConfig
from tests.integration.conftest import InprocLab
from tests.tui.conftest import SIZE, make_app, until
from tui.fleet_table import FleetTable
from tui.screens.node import NodeScreen
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


async def test_a_node_screen_reading_as_bc_serve_goes_away_keeps_running_and_reads_again_once_it_answers(
    lab: InprocLab,
) -> None:
    """The node's screen reads four things in turn on the feed's connection; `bc serve` going away between two
    of them closed that connection under it, and the next read raised out of the screen: `bc tui` exited with
    a traceback. Now that read is "not answering" like any other, and the screen reads again when it is back."""
    await lab.join("n1")
    await lab.start_node("n1")
    await lab.wait_connected("n1")
    cfg = OperatorConfig.load(lab.server.operator_config)
    app = make_app(cfg)
    async with app.run_test(size=SIZE) as pilot:
        table = app.screen.query_one(FleetTable)
        await until(pilot, lambda: app.state.link.live and table.current_node() == "n1")
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, NodeScreen))
        screen = app.screen
        assert isinstance(screen, NodeScreen)
        detail = screen.query_one("#node-detail", Static)
        await until(pilot, lambda: "SECTIONS" in str(detail.render()), what="the node's detail")

        # Hold the screen's next read after its first call until the feed has dropped the connection (the
        # window a real restart hits by chance), then let it go on with the calls it has left.
        src = app.feed.source
        assert src is not None
        get_node, got = src.get_node, asyncio.Event()

        async def get_node_then_wait_for_the_drop(node_id: str) -> admin_pb2.NodeInfo:
            info = await get_node(node_id)
            got.set()
            while app.feed.source is src:
                await asyncio.sleep(0.01)
            return info

        src.get_node = get_node_then_wait_for_the_drop  # type: ignore[method-assign]
        screen.spawn(screen.reload, "reload")
        await until(pilot, got.is_set, what="the read started")
        address = lab.server.address
        await lab.server.stop()  # the node stays up (its going would be an event, and a new read of the screen)
        await until(pilot, lambda: "not answering" in banner(app), what="the banner")
        await pilot.pause(0.3)  # the held read goes on and fails
        assert app.is_running and app.screen is screen and screen.has_class("-stale")

        opts = ServeOptions(data_dir=lab.root / "server", listen=address, heartbeat_interval_s=1.0)
        server = Server(opts, Seams.production())
        await server.start()
        lab.server = server
        await until(pilot, lambda: app.state.link.live and banner(app) == "", what="the banner goes")
        assert app.screen is screen and not screen.has_class("-stale")
        await lab.admin.label_node("n1", {"rack": "r9"}, [])
        await until(pilot, lambda: "rack=r9" in str(detail.render()), what="the node's screen live again")
        await pilot.press("q")
