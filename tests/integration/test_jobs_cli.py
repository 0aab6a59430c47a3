"""`bc jobs` and `bc nodes cordon/uncordon` through the real CLI against a real `bc serve` (the lab of
test_quorum_cli: the server on its own loop, the CLI under CliRunner, n1 and n2 joined).

What an operator sees: a job runs to its end with a progress line and exits 0 done, 8 failed; `--no-wait`
prints the id; list, show and cancel; the slot pools and who may set them; and bad input is one
sentence, a non-zero exit and nothing stored. Waits are on the server's WatchJob stream, never sleeps.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bc.client.admin import AdminClient
from bc.errors import UsageError
from bc.protocol.pb import admin_pb2
from bc.runtime.config import OperatorConfig
from tests.integration.test_cli_cmd import bc, ok_json
from tests.integration.test_quorum_cli import Lab, as_operator, operator_config, refused, running_lab


@pytest.fixture
def lab(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Lab]:
    yield from running_lab(tmp_path, monkeypatch)


def admin(lab: Lab) -> AdminClient:
    assert lab.server.operator_config is not None
    return AdminClient(OperatorConfig.load(lab.server.operator_config))


def until_terminal(lab: Lab, dag_id: str) -> admin_pb2.JobInfo:
    """The DAG once terminal, read off the server's WatchJob stream (which ends there)."""

    async def watch() -> admin_pb2.JobInfo:
        async with admin(lab) as c:
            last = None
            async for job in c.watch_job(dag_id):
                last = job
            assert last is not None and last.terminal, last
            return last

    return lab.run(watch())


def until_running(lab: Lab, dag_id: str, node_id: str) -> admin_pb2.JobInfo:
    async def watch() -> admin_pb2.JobInfo:
        async with admin(lab) as c:
            async for job in c.watch_job(dag_id):
                if any(n.id == node_id and n.state == "running" for n in job.nodes):
                    return job
            raise AssertionError(f"{dag_id} ended before {node_id} ran")

    return lab.run(watch())


def no_jobs_stored(lab: Lab) -> None:
    assert ok_json("jobs", "list", "--all") == []


def has_gpus(lab: Lab, node_id: str) -> str:
    """The node's first GPU once it has reported its inventory (the next status after connecting)."""

    async def wait() -> str:
        async with admin(lab) as c:
            async for _ev in c.watch(type_prefix="node."):
                node = await c.get_node(node_id)
                if node.inventory.gpus:
                    return node.inventory.gpus[0].uuid
        raise AssertionError("the event stream ended")

    return lab.run(wait())


# -- run: to the end, or not waiting ------------------------------------------------------------------


def test_cordon_and_uncordon_run_to_the_end_and_set_the_node(lab: Lab) -> None:
    r = bc("jobs", "run", "cordon", "n1")
    assert r.exit_code == 0, r.output
    dag_id, line = r.stdout.strip().split("  ", 1)
    assert dag_id.startswith("j-") and line.startswith("✓ cordon n1  "), r.stdout
    assert "set:n1✓" in line
    assert ok_json("nodes", "show", "n1")["cordoned"] is True

    doc = ok_json("jobs", "run", "uncordon", "n1")
    assert (doc["template"], doc["state"], doc["terminal"], doc["subjects"]) == ("uncordon", "done", True, ["n1"])
    assert doc["requested_by"] == "local" and all(n["state"] == "done" for n in doc["nodes"])
    assert ok_json("nodes", "show", "n1")["cordoned"] is False

    shown = ok_json("jobs", "show", dag_id)
    assert shown["id"] == dag_id and shown["state"] == "done"
    listed = ok_json("jobs", "list")
    assert [j["template"] for j in listed] == ["cordon", "uncordon"]


def test_nodes_cordon_is_a_one_node_job_with_the_node_as_its_answer(lab: Lab) -> None:
    assert ok_json("nodes", "cordon", "n2")["cordoned"] is True
    r = bc("nodes", "uncordon", "n2")
    assert r.exit_code == 0 and r.stdout.strip() == "uncordoned n2", r.output
    assert [(j["template"], j["subjects"], j["state"]) for j in ok_json("jobs", "list")] == [
        ("cordon", ["n2"], "done"),
        ("uncordon", ["n2"], "done"),
    ]
    events = {(e["type"], e["subject"]): e["data"] for e in ok_json("events", "--limit", "1000")}
    assert ("node.cordoned", "n2") in events and ("node.uncordoned", "n2") in events


def test_no_wait_prints_the_id_and_a_job_behind_another_waits_its_turn(lab: Lab) -> None:
    lab.start_node("n1")
    gpu = has_gpus(lab, "n1")
    hold = ok_json("reserve", "--gpus", "1", "--node", "n1")
    assert [d["gpu_uuid"] for d in hold["devices"]] == [gpu]

    r = bc("jobs", "run", "drain", "n1", "--no-wait")
    assert r.exit_code == 0, r.output
    drain_id = r.stdout.strip()
    assert drain_id.startswith("j-") and "\n" not in drain_id
    until_running(lab, drain_id, "drain:n1")

    queued = ok_json("jobs", "run", "cordon", "n1", "--no-wait")
    assert queued["terminal"] is False and {n["state"] for n in queued["nodes"]} == {"queued"}

    listed = {j["id"]: j for j in ok_json("jobs", "list")}
    assert (listed[drain_id]["state"], listed[queued["id"]]["state"]) == ("running", "queued")

    table = bc("jobs", "show", queued["id"])
    assert table.exit_code == 0, table.output
    lines = table.stdout.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("NODE"))
    assert lines[head].split() == ["NODE", "KIND", "SUBJECT", "STATE", "DEPS", "ERROR/DETAIL"]
    assert any(line.split()[:4] == ["set:n1", "SetWanted", "n1", "○"] for line in lines[head + 1 :]), table.stdout

    r = bc("jobs", "cancel", queued["id"])
    assert r.exit_code == 0 and "cancelled" in r.stdout and "nothing" not in r.stdout, r.output
    ended = until_terminal(lab, queued["id"])
    assert ended.state == "cancelled"
    refused(bc("jobs", "cancel", queued["id"]), 4, f"job {queued['id']} already ended")

    # The drain ends once the hold is released.
    ok_json("release", hold["id"])
    assert until_terminal(lab, drain_id).state == "done"


def test_a_failed_job_exits_8_with_its_reason(lab: Lab) -> None:
    lab.start_node("n1")
    has_gpus(lab, "n1")
    ok_json("reserve", "--gpus", "1", "--node", "n1")
    r = bc("jobs", "run", "drain", "n1", "--deadline", "1s")
    assert r.exit_code == 8, r.output
    err = r.stderr.strip().splitlines()
    assert err[0].startswith("job j-") and "submitted" in err[0], r.stderr
    assert err[-1].startswith("error: job j-") and "(drain n1) failed: " in err[-1], r.stderr
    assert "✗ drain n1" in r.stdout


# -- bad input: one sentence, non-zero, nothing stored ------------------------------------------------


def test_bad_input_is_one_sentence_and_stores_nothing(lab: Lab, tmp_path: Path) -> None:
    refused(bc("jobs", "run", "reboot", "n1", "ghost"), 3, "no node named 'ghost'")
    refused(bc("jobs", "run", "defrag", "n1"), 2, "there is no job template 'defrag'")
    refused(bc("jobs", "run", "reboot", "n1", "--max-parallel", "0"), 2, "--max-parallel")
    refused(bc("jobs", "run", "reboot", "n1", "n1"), 2, "node n1 appears twice")
    refused(
        bc("jobs", "run", "rollout", "--section", "host", "--file", str(tmp_path / "missing.json"), "--nodes", "n1"),
        2,
        "cannot read the host section",
    )
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    refused(
        bc("jobs", "run", "rollout", "--section", "host", "--file", str(broken), "--nodes", "n1"), 2, "not valid JSON"
    )
    wrong = tmp_path / "wrong.json"
    wrong.write_text('{"no_such_field": 1}')
    refused(bc("jobs", "run", "rollout", "--section", "host", "--file", str(wrong), "--nodes", "n1,n2"), 2, "host")
    refused(
        bc("jobs", "run", "rollout", "--section", "host", "--file", str(wrong), "--nodes", ""), 2, "comma-separated"
    )
    refused(bc("jobs", "run", "remediate", "n1"), 4, "no approvers are configured")
    refused(bc("jobs", "show", "j-nope"), 3, "no job named 'j-nope'")
    refused(bc("jobs", "cancel", "j-nope"), 3, "no job named 'j-nope'")

    async def api(request: admin_pb2.SubmitJobRequest) -> str:
        async with admin(lab) as c:
            try:
                await c.submit_job(request)
            except UsageError as e:
                return e.message
        raise AssertionError(f"{request} was accepted")

    assert "needs at least one node" in lab.run(api(admin_pb2.SubmitJobRequest(template="reboot")))
    assert "--max-parallel must be" in lab.run(
        api(admin_pb2.SubmitJobRequest(template="reboot", nodes=["n1"], max_parallel=0))
    )
    no_jobs_stored(lab)


def test_cancelling_a_terminal_job_is_a_conflict(lab: Lab) -> None:
    doc = ok_json("jobs", "run", "cordon", "n2")
    refused(bc("jobs", "cancel", doc["id"]), 4, "already ended done")


# -- slots and roles ---------------------------------------------------------------------------------------


def test_slots_show_and_set_and_only_an_admin_sets_them(lab: Lab, tmp_path: Path) -> None:
    pools = {p["name"]: p for p in ok_json("jobs", "slots")}
    assert {"reboots", "rollouts", "remediations"} <= set(pools)
    assert all(set(p) == {"name", "capacity", "held"} for p in pools.values())
    after = {p["name"]: p["capacity"] for p in ok_json("jobs", "slots", "--set", "reboots=2", "--set", "rollouts=3")}
    assert (after["reboots"], after["rollouts"]) == (2, 3)
    refused(bc("jobs", "slots", "--set", "nope=1"), 2, "there is no slot pool 'nope'")
    assert {p["name"]: p["capacity"] for p in ok_json("jobs", "slots")} == after
    table = bc("jobs", "slots")
    assert table.exit_code == 0 and table.stdout.splitlines()[0].split() == ["POOL", "CAPACITY", "HELD"]

    viewer = operator_config(tmp_path, "bob", role="viewer")
    carol = operator_config(tmp_path, "carol", role="operator")
    for who, args in ((viewer, ("jobs", "list")), (viewer, ("jobs", "slots"))):
        r = as_operator(who, *args)
        assert r.exit_code == 0, (args, r.output)
    refused(as_operator(viewer, "jobs", "run", "reboot", "n2"), 6, "running a job needs the operator role")
    refused(as_operator(viewer, "jobs", "run", "cordon", "n2"), 6, "cordoning a node needs the admin role")
    refused(as_operator(carol, "jobs", "run", "uncordon", "n2"), 6, "uncordoning a node needs the admin role")
    refused(as_operator(carol, "jobs", "run", "drain", "n2"), 6, "a drain job: cordoning a node needs the admin role")
    refused(as_operator(carol, "jobs", "slots", "--set", "reboots=4"), 6, "setting job slot pools needs the admin role")
    r = bc("jobs", "run", "drain", "n2", "--json")
    assert r.exit_code == 0, r.output
    doc: dict[str, Any] = json.loads(r.stdout)
    assert doc["requested_by"] == "local" and doc["state"] == "done"


# -- labels (capacity selects nodes by them) --------------------------------------------------------------


def test_nodes_label_sets_and_removes_and_refuses_system_keys(lab: Lab) -> None:
    doc = ok_json("nodes", "label", "n1", "pool=a100", "rack=r7")
    assert doc["labels"] == {"pool": "a100", "rack": "r7"}
    out = bc("nodes", "label", "n1", "--remove", "rack")
    assert out.exit_code == 0 and out.stdout.strip() == "n1 labels: pool=a100"
    refused(bc("nodes", "label", "n1", "bc.dev/cap.devices.limits=1"), 2, "is the system's")
    refused(bc("nodes", "label", "n1", "bad key=1"), 2, "bad label key")
    refused(bc("nodes", "label", "n9", "pool=x"), 3, "no node named 'n9'")
    assert ok_json("nodes", "show", "n1")["labels"] == {"pool": "a100"}
