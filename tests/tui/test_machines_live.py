"""The TUI's machines screen against a real `bc serve`: a viewer sees an enrolled machine with its site and
state, and the screen follows the store (a `metal.` event reloads it: the machine removed leaves the table)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agent.join import join_node
from bc.protocol.pb import metal_pb2
from tests.integration.conftest import InprocLab, open_lab
from tests.integration.operators_lab import add_operator
from tests.tui.conftest import SIZE, make_app, until
from tui.screens.machines import MachinesScreen


@pytest.fixture
async def lab(tmp_path: Path, store_url: str) -> AsyncIterator[InprocLab]:
    async with open_lab(tmp_path, store=store_url) as lab:
        yield lab


async def test_a_viewer_sees_the_machines_and_their_state_follow_the_store(lab: InprocLab) -> None:
    tok = await lab.admin.create_token("s1", role="site")
    await join_node(lab.server.address, tok.token, lab.node_dir("s1"))
    for name, url in (("m1", "http://10.9.0.11"), ("m2", "http://10.9.0.12")):
        await lab.admin.enroll_machine(metal_pb2.EnrollMachineRequest(name=name, site_node="s1", bmc_url=url))
    app = make_app(await add_operator(lab, "vera", "viewer"))
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.state.link.live and app.role == "viewer")
        await pilot.press("9")
        screen = app.screen
        assert isinstance(screen, MachinesScreen)
        await until(pilot, lambda: sorted(screen.machines) == ["m1", "m2"])
        m1 = screen.machines["m1"]
        assert (m1.site_node, m1.state, m1.bmc_url) == ("s1", "enrolled", "http://10.9.0.11")
        await lab.admin.remove_machine("m2")
        await until(pilot, lambda: sorted(screen.machines) == ["m1"], what="the removed machine leaves the screen")
        await pilot.press("q")
