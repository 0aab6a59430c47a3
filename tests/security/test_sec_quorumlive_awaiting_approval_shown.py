"""Attack (on the operator's view): a job waiting for its quorum looks like any running job (`batch▶`), so
nobody knows a signature is missing, or which batch to sign, and it waits until its batch expires.

`bc jobs show` and the TUI's jobs screen say which batch waits and how many approvals count:
`awaiting approval: batch B, 1 of 2 signed`, against a real `bc serve` (the TUI driven by Textual's pilot).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from textual.widgets import Static

from bc.protocol.pb import admin_pb2
from bc.runtime.config import OperatorConfig
from tests.integration.conftest import InprocLab, lab, store_url  # noqa: F401  (the fixtures)
from tests.integration.operators_lab import approvers, sign
from tests.security.quorumlive_helpers import bc_cli, use_lab_config
from tests.tui.conftest import SIZE, make_app, until
from tui.screens.jobs import JobsScreen


async def batch_waiting(server: InprocLab, dag_id: str) -> str:
    """The id of the job's batch once its Batch node runs (created, waiting for the quorum)."""
    async for job in server.admin.watch_job(dag_id):
        for n in job.nodes:
            if n.kind == "Batch" and n.state == "running":
                return str(json.loads(n.detail_json)["batch_id"])
    raise AssertionError(f"job {dag_id} ended before its batch waited")


async def test_a_job_waiting_for_its_quorum_shows_the_batch_and_its_signatures_in_the_cli_and_the_tui(
    lab: InprocLab,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    for n in ("n1", "n2"):
        await lab.join(n)
    keys = await approvers(lab, n=3, k=2)
    job = await lab.admin.submit_job(admin_pb2.SubmitJobRequest(template="reboot", nodes=["n1", "n2"]))
    batch_id = await batch_waiting(lab, job.id)
    await sign(lab, await lab.admin.get_batch(batch_id), keys[0])
    waiting = f"awaiting approval: batch {batch_id}, 1 of 2 signed"

    use_lab_config(lab, monkeypatch, tmp_path)
    r = await bc_cli("jobs", "show", job.id)
    assert r.exit_code == 0, r.output
    assert waiting in r.stdout.splitlines(), r.stdout
    doc = json.loads((await bc_cli("jobs", "show", job.id, "--json")).stdout)
    assert doc["awaiting_approval"] == [{"node": "batch", "batch_id": batch_id, "signed": 1, "needed": 2}], doc

    app = make_app(OperatorConfig.load(lab.server.operator_config))
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.state.link.live)
        await pilot.press("3")
        screen = app.screen
        assert isinstance(screen, JobsScreen)
        await until(pilot, lambda: [j.id for j in screen.jobs] == [job.id], what="the job is listed")

        def card() -> str:
            return str(screen.query_one("#job-0", Static).render())

        await until(pilot, lambda: waiting in card(), what=f"the card says {waiting!r}")
        # A second signature approves the batch: the card stops saying it waits (woken by the job's events).
        await sign(lab, await lab.admin.get_batch(batch_id), keys[1])
        await until(pilot, lambda: "awaiting approval" not in card(), what="the wait leaves the card")
        await pilot.press("q")
    await lab.admin.cancel_job(job.id)
