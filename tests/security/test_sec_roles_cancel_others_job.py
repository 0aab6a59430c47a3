"""Attack: an operator cancels a job another operator runs (stopping their rollout half way). Cancelling
someone else's job needs admin: refused exit 6 naming the role and the job's owner, the job goes on; an
admin may cancel it; an operator's own job cancel still works."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_cli_cmd import bc, ok_json
from tests.integration.test_quorum_cli import as_operator, refused
from tests.security.roles_helpers import Lab, operator_config, serve_lab


@pytest.fixture
def lab(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Lab]:
    yield from serve_lab(tmp_path, monkeypatch)


def rollout(config: Path, tmp_path: Path, node: str) -> dict[str, Any]:
    """A rollout that stays running: its node is joined but not connected, so the patch is never observed."""
    section = tmp_path / "telemetry.json"
    section.write_text("{}")
    args = ("jobs", "run", "rollout", "--section", "telemetry", "--file", str(section), "--nodes", node)
    r = as_operator(config, *args, "--no-wait", "--json")
    assert r.exit_code == 0, r.output
    doc: dict[str, Any] = json.loads(r.stdout)
    assert doc["terminal"] is False
    return doc


def test_an_operator_cannot_cancel_another_operators_job_and_an_admin_can(lab: Lab, tmp_path: Path) -> None:
    dave = operator_config(tmp_path, "dave", role="operator")
    carol = operator_config(tmp_path, "carol", role="operator")
    job = rollout(dave, tmp_path, "n1")
    refused(
        as_operator(carol, "jobs", "cancel", job["id"]),
        6,
        f"cancelling another operator's job ({job['id']} was run by dave) needs the admin role;"
        " operator carol has the operator role",
    )
    shown = ok_json("jobs", "show", job["id"])
    assert shown["terminal"] is False and shown["cancel_requested"] is False
    assert not [e for e in ok_json("events", "--type", "job.cancel") if e["subject"] == job["id"]]

    r = bc("jobs", "cancel", job["id"], "--json")  # local, an admin
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["job"]["cancel_requested"] is True


def test_an_operators_own_job_cancel_still_works(lab: Lab, tmp_path: Path) -> None:
    carol = operator_config(tmp_path, "carol", role="operator")
    job = rollout(carol, tmp_path, "n2")
    r = as_operator(carol, "jobs", "cancel", job["id"], "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["job"]["cancel_requested"] is True
