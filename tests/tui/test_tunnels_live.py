"""The TUI's tunnels screen against a real `bc serve` and agent: an open tunnel shows with who, where and why,
and an admin closes it from the screen (the operator's end sees it close); a viewer is not offered the key."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bc.client.tunnel import TunnelClient
from bc.errors import BcError
from bc.runtime.config import OperatorConfig
from tests.integration.conftest import InprocLab, open_lab
from tests.integration.operators_lab import add_operator
from tests.tui.conftest import SIZE, make_app, until
from tui.screens.tunnels import TunnelsScreen
from tui.widgets import ConfirmScreen


@pytest.fixture
async def lab(tmp_path: Path, store_url: str) -> AsyncIterator[InprocLab]:
    """The conftest's lab, with tunnels on (`bc serve --tunnels`)."""
    async with open_lab(tmp_path, store=store_url, tunnels=True) as lab:
        yield lab


async def test_an_admin_sees_an_open_tunnel_and_closes_it(lab: InprocLab, echo_port: int) -> None:
    await lab.join("n1")
    await lab.start_node("n1")
    await lab.wait_connected("n1")
    await lab.wait_observed("n1", (await lab.admin.get_spec("n1")).generation)
    olga = await add_operator(lab, "olga", "operator")
    assert lab.server.operator_config is not None
    admin_cfg = OperatorConfig.load(lab.server.operator_config)
    async with TunnelClient(olga) as c:
        t = await c.connect("n1", "forward", echo_port, reason="read the exporter")
        app = make_app(admin_cfg)
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: app.state.link.live)
            await pilot.press("8")
            screen = app.screen
            assert isinstance(screen, TunnelsScreen)
            await until(pilot, lambda: list(screen.tunnels) == [t.ticket.sid])
            shown = screen.tunnels[t.ticket.sid]
            assert (shown.operator, shown.node_id, shown.reason) == ("olga", "n1", "read the exporter")
            await pilot.press("x")
            await until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
            await pilot.press("y")
            await until(pilot, lambda: screen.tunnels == {}, what="the closed tunnel leaves the screen")
            await pilot.press("q")
        with pytest.raises(BcError):  # the operator's end: cut, with the server's word for it
            while await t.recv() is not None:
                pass
    (r,) = await lab.admin.list_tunnels(node_id="n1")
    assert r.state == "closed" and "closed from bc tui" in r.end_reason


async def test_a_viewer_is_not_offered_the_close_key(lab: InprocLab) -> None:
    viewer = await add_operator(lab, "vera", "viewer")
    app = make_app(viewer)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.state.link.live and app.role == "viewer")
        await pilot.press("8")
        assert isinstance(app.screen, TunnelsScreen)
        assert app.screen.check_action("close_tunnel", ()) is False
        await pilot.press("q")
