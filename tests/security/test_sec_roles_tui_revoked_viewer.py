"""Attack: a viewer revoked while `bc tui` is open on a shared screen keeps showing the fleet it last saw, as
if current (stale rows under a revoked key). Revocation closes the TUI's stream; the screen shows a banner with
the reason and no rows (Textual pilot against a real `bc serve`)."""

from __future__ import annotations

import time

import pytest

from bc.runtime.config import OperatorConfig
from tests.integration.conftest import InprocLab, lab  # noqa: F401  (the fixture)
from tests.integration.operators_lab import add_operator
from tests.tui.conftest import SIZE, make_app, until
from tui.fleet_table import FleetTable
from tui.widgets import Banner


@pytest.fixture
def store_url() -> str:
    return ""  # the TUI is a client of the Admin API: the embedded store is enough


def banner(app: object) -> str:
    b = app.screen.query_one(Banner)  # type: ignore[attr-defined]
    return str(b.render()) if b.has_class("shown") else ""


async def test_a_revoked_viewers_tui_shows_a_banner_not_stale_rows(lab: InprocLab) -> None:  # noqa: F811
    await lab.join("n1")
    await lab.start_node("n1")
    await lab.wait_connected("n1")
    cfg: OperatorConfig = await add_operator(lab, "vic", "viewer")
    app = make_app(cfg)
    async with app.run_test(size=SIZE) as pilot:
        table = app.screen.query_one(FleetTable)
        await until(pilot, lambda: app.state.link.live and table.row_count == 1, what="the fleet on screen")
        assert banner(app) == ""

        await lab.admin.revoke_operator("vic", reason="left the team")
        revoked_at = time.monotonic()
        await until(pilot, lambda: "revoked" in banner(app), timeout=10, what="the banner")
        assert time.monotonic() - revoked_at <= 2.0
        assert "refused this operator: operator vic was revoked (left the team)" in banner(app), banner(app)
        await until(pilot, lambda: table.row_count == 0, timeout=5, what="no stale rows")
        assert app.state.rows == {}
        await pilot.press("q")
