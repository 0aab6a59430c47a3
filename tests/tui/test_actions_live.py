"""Approving and cancelling from the TUI, against a real `bc serve` with fake nodes."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

from cryptography.hazmat.primitives import serialization

from bc.protocol.pb import admin_pb2
from bc.runtime.config import OperatorConfig
from tests.integration.conftest import InprocLab
from tests.integration.operators_lab import approvers, sign
from tests.tui.conftest import SIZE, make_app, until
from tui.fleet_table import FleetTable
from tui.screens.approvals import ApprovalsScreen
from tui.screens.jobs import JobsScreen
from tui.widgets import ConfirmScreen, PromptScreen


async def connected(lab: InprocLab, *nodes: str) -> None:
    for n in nodes:
        await lab.join(n)
        await lab.start_node(n)
        await lab.wait_connected(n)


async def trusted(lab: InprocLab, nodes: tuple[str, ...], n_keys: int) -> None:
    """The approver set has reached the live sessions (as test_quorum_inprocess waits for it)."""
    async with asyncio.timeout(10):
        while any(len(lab.agents[n].trust.bundle.approver_keys) != n_keys for n in nodes):
            await asyncio.sleep(0.05)


async def test_approving_a_batch_on_the_approvals_screen_releases_its_commands_and_they_run(
    lab: InprocLab, tmp_path: Path
) -> None:
    await connected(lab, "n1", "n2")
    keys = await approvers(lab)
    await trusted(lab, ("n1", "n2"), 3)
    gpus = [lab.agents[n].inventory.gpus[0].uuid for n in ("n1", "n2")]
    b = await lab.admin.create_batch("gpu.reset", ["n1", "n2"], json.dumps({"gpu_uuids": gpus}), reason="XID 79")
    b = await sign(lab, b, keys[0])
    assert b.state == "pending" and b.approvals == 1
    key_file = tmp_path / "approver1.key"
    pem = keys[1].key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    key_file.write_bytes(pem)
    os.chmod(key_file, 0o600)

    app = make_app(keys[1].config)  # the approver's own operator certificate
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.state.link.live)
        await pilot.press("2")
        screen = app.screen
        assert isinstance(screen, ApprovalsScreen)
        await until(pilot, lambda: [x.id for x in screen.batches] == [b.id])
        await pilot.press("a")
        await until(pilot, lambda: isinstance(app.screen, PromptScreen))
        await pilot.press(*str(key_file), "enter")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        shown = str(app.screen.query_one("#confirm-body").render())
        # What the signature covers: the recomputed root, the leaf count, the expiry.
        assert b.scope_root in shown and "leaf count     2" in shown and "expires" in shown, shown
        await pilot.press("y")
        await until(pilot, lambda: screen.batches == [], what="the approved batch leaves the pending list")
        await pilot.press("q")
    after = await lab.admin.get_batch(b.id)
    assert after.state == "approved" and after.approvals == 2
    for leaf in after.leaves:
        done = await lab.wait_event("command.settled", lambda ev, d, cid=leaf.command_id: ev.subject == cid)
        assert json.loads(done.data_json)["state"] == "succeeded"
    assert not hasattr(app, "key") and str(key_file) == app.approver_key  # the path is remembered, not the key


async def test_a_viewer_sees_batches_but_is_offered_neither_approve_nor_reject(lab: InprocLab) -> None:
    from tests.integration.operators_lab import add_operator

    await connected(lab, "n1")
    keys = await approvers(lab, n=2, k=1)
    await trusted(lab, ("n1",), 2)
    b = await lab.admin.create_batch("node.reboot", ["n1"], "{}", reason="kernel")
    viewer = await add_operator(lab, "watcher", role="viewer")
    app = make_app(viewer)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.state.link.live and app.role == "viewer")
        await pilot.press("2")
        screen = app.screen
        assert isinstance(screen, ApprovalsScreen)
        await until(pilot, lambda: [x.id for x in screen.batches] == [b.id])
        footer_keys = {binding.action for _, binding, enabled, _ in app.active_bindings.values() if enabled}
        assert "approve" not in footer_keys and "reject" not in footer_keys
        await pilot.press("a")
        await pilot.pause(0.2)
        assert app.screen is screen  # no key prompt
        await pilot.press("q")
    assert (await lab.admin.get_batch(b.id)).state == "pending" and keys


async def test_cancelling_a_dag_on_the_jobs_screen_cancels_it(lab: InprocLab) -> None:
    await connected(lab, "n1")
    await lab.admin.reserve(1, node_id="n1")  # a hold the drain waits on: the DAG stays running
    job = await lab.admin.submit_job(admin_pb2.SubmitJobRequest(template="drain", nodes=["n1"]))
    app = make_app(OperatorConfig.load(lab.server.operator_config))
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.state.link.live)
        await pilot.press("3")
        screen = app.screen
        assert isinstance(screen, JobsScreen)
        await until(pilot, lambda: [j.id for j in screen.jobs] == [job.id])
        await pilot.press("c")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        await pilot.press("y")
        await until(pilot, lambda: bool(screen.jobs) and screen.jobs[0].terminal, what="the DAG ends")
        assert screen.jobs[0].state == "cancelled"
        await pilot.press("q")
    assert (await lab.admin.get_job(job.id)).state == "cancelled"


async def test_releasing_a_reservation_on_the_reservations_screen_after_confirmation(lab: InprocLab) -> None:
    from tui.screens.reservations import ReservationsScreen

    await connected(lab, "n1")
    hold = await lab.admin.reserve(1, node_id="n1")
    app = make_app(OperatorConfig.load(lab.server.operator_config))
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.state.link.live)
        await pilot.press("4")
        screen = app.screen
        assert isinstance(screen, ReservationsScreen)
        await until(pilot, lambda: hold.id in screen.by_id and screen.by_id[hold.id].state == "active")
        row = [str(c) for c in screen.query_one("#reservations").get_row(hold.id)]  # type: ignore[attr-defined]
        assert row[3] == "n1" and row[5].startswith("bc.dev/gpu="), row  # the CDI name a container asks for
        await pilot.press("d")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        await pilot.press("y")
        await until(pilot, lambda: screen.by_id.get(hold.id) is not None and screen.by_id[hold.id].state != "active")
        await pilot.press("q")
    assert (await lab.admin.get_reservation(hold.id)).state in ("releasing", "released")


async def test_running_a_command_from_the_node_screen_goes_through_runcommand_and_settles(lab: InprocLab) -> None:
    from tui.screens.node import NodeScreen
    from tui.widgets import RunCommandScreen

    await connected(lab, "n1")
    app = make_app(OperatorConfig.load(lab.server.operator_config))
    async with app.run_test(size=SIZE) as pilot:
        table = app.screen.query_one(FleetTable)
        await until(pilot, lambda: app.state.link.live and table.row_count == 1)
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, NodeScreen))
        await pilot.press("r")
        await until(pilot, lambda: isinstance(app.screen, RunCommandScreen))
        await pilot.press("ctrl+s")  # the first kind, inventory.refresh, with {}
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        assert "inventory.refresh on n1" in str(app.screen.query_one("#confirm-body").render())
        await pilot.press("y")
        await until(pilot, lambda: isinstance(app.screen, NodeScreen))
        await pilot.press("q")
    cmds = await lab.admin.list_commands(node_id="n1")
    assert [c.kind for c in cmds] == ["inventory.refresh"] and cmds[0].requested_by
    done = await lab.wait_event("command.settled", lambda ev, d: ev.subject == cmds[0].id)
    assert json.loads(done.data_json)["state"] == "succeeded"
