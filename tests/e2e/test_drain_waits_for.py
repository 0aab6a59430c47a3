"""A drain that waits says what it waits for: each reservation's id, tenant and end, on the progress line
of `bc jobs run drain` and in `bc jobs show` (text and JSON), against real `bc serve` and `bc node`."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import pytest

from .harness import Lab, assert_no_tracebacks, bring_up, job_node


def iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@pytest.mark.e2e
def test_a_waiting_drain_names_the_reservations_it_waits_for(lab: Lab) -> None:
    bring_up(lab, {"n1": "hgx-h100-8"})
    billed = lab.bc("reserve", "--gpus", "1", "--node", "n1", "--tenant", "acme", "--duration", "2h")
    open_ended = lab.bc("reserve", "--gpus", "1", "--node", "n1")
    end_ms = int(lab.wait_reservation_state(billed["id"], "active")["end_ms"])
    waits = f"waits for {billed['id']} (tenant acme, ends {iso(end_ms)}), {open_ended['id']} (no tenant, open-ended)"

    # Waited for: the progress line names them while it waits, then the drain fails at its deadline.
    failed = lab.run("jobs", "run", "drain", "n1", "--deadline", "3s", timeout=60)
    assert failed.returncode == 8, failed.stderr
    progress = [line for line in failed.stderr.splitlines() if line.startswith("▶ drain n1")]
    assert progress and progress[0].endswith(f"; drain:n1 {waits}"), failed.stderr

    # Not waited for: `bc jobs show` names them in the node's row, and the JSON detail holds them.
    dag_id = lab.run("jobs", "run", "drain", "n1", "--no-wait").stdout.strip()
    doc = lab.wait_job(dag_id, "drain:n1 running", lambda d: job_node(d, "drain:n1")["state"] == "running")
    assert job_node(doc, "drain:n1")["detail"]["waiting_for"] == [
        {"id": billed["id"], "tenant": "acme", "end_ms": end_ms},
        {"id": open_ended["id"], "tenant": "", "end_ms": None},
    ]
    shown = lab.run("jobs", "show", dag_id)
    row = next(line for line in shown.stdout.splitlines() if line.startswith("drain:n1"))
    assert re.search(r"▶ running\s+set:n1\s+" + re.escape(waits) + r" deadline_ms=\d+$", row), shown.stdout

    # One released: the drain waits for the other alone; both released: it is done.
    lab.bc("release", billed["id"])
    lab.wait_job(
        dag_id,
        "waiting for one",
        lambda d: [r["id"] for r in job_node(d, "drain:n1")["detail"].get("waiting_for", [])] == [open_ended["id"]],
    )
    lab.bc("release", open_ended["id"])
    done = lab.wait_job_terminal(dag_id)
    assert done["state"] == "done" and "waiting_for" not in job_node(done, "drain:n1")["detail"], done
    assert_no_tracebacks(lab)
