"""What `bc jobs` prints and refuses before any call: progress lines, the DAG document, `--set`, and the
request bounds the API checks (`bc.api.job_views`)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from bc.api import job_views
from bc.api.admin_roles import needed
from bc.cli.job_cmds import parse_slot, render_job
from bc.cli.job_progress import CHAIN_WIDTH, JobFailed, check_done, job_to_json, progress_line
from bc.cli.main import cli
from bc.errors import UsageError
from bc.jobs.views import DagView, JobRequest, NodeView, PoolView
from bc.protocol.pb import admin_pb2


def node(id_: str, state: str, *, subject: str = "n1", error: str = "", deps: tuple[str, ...] = ()) -> NodeView:
    return NodeView(
        id=id_,
        kind="Command",
        subject=subject,
        state=state,
        error=error,
        deps=tuple((d, "after_ok") for d in deps),
        group="",
        tail=False,
        detail={"command_id": "c-1"} if state == "running" else {},
    )


def dag(*nodes: NodeView, state: str = "running", terminal: bool = False, first_error: str = "") -> DagView:
    return DagView(
        id="j-1",
        template="reboot",
        state=state,
        terminal=terminal,
        subjects=("n1", "n2"),
        args={"max_parallel": 2},
        requested_by="local",
        reason="kernel",
        first_error=first_error,
        cancel_requested=False,
        created_at_ms=1_700_000_000_000,
        settled_at_ms=0,
        nodes=nodes,
        seq=42,
    )


def info(d: DagView) -> admin_pb2.JobInfo:
    return job_views.job_info(d)


# -- the progress line ------------------------------------------------------------------------------


def test_a_progress_line_is_the_rollup_glyph_template_subjects_and_chain() -> None:
    job = info(dag(node("cordon", "done"), node("drain", "running", deps=("cordon",)), node("reboot", "queued")))
    assert progress_line(job) == "▶ reboot n1,n2  cordon✓ drain▶ reboot○"


def test_a_failed_job_line_carries_its_reason() -> None:
    job = info(
        dag(
            node("drain", "failed", error="holds left: r-1"), node("reboot", "cancelled"), state="failed", terminal=True
        )
    )
    assert progress_line(job) == "✗ reboot n1,n2  drain✗ reboot⊘  (failed: drain: holds left: r-1)"


def test_a_long_chain_becomes_counts_and_the_running_nodes() -> None:
    nodes = [node(f"n{i}.reboot", "done" if i < 40 else "running" if i < 42 else "queued") for i in range(100)]
    line = progress_line(info(dag(*nodes)))
    assert "\n" not in line and len(line) < CHAIN_WIDTH + 40
    assert line.endswith("100 nodes: 40✓ 2▶ 58○; running n40.reboot, n41.reboot")


def test_check_done_raises_exit_8_with_the_first_error() -> None:
    check_done(info(dag(node("a", "done"), state="done", terminal=True)))
    with pytest.raises(JobFailed, match=r"^job j-1 \(reboot n1,n2\) failed: no approvers$") as e:
        check_done(info(dag(node("a", "failed"), state="failed", terminal=True, first_error="no approvers")))
    assert e.value.exit_code == 8
    with pytest.raises(JobFailed, match=r"cancelled: cancelled$"):
        check_done(info(dag(node("a", "cancelled"), state="cancelled", terminal=True)))


# -- the DAG document -------------------------------------------------------------------------------


def test_the_dag_document_keys_in_order_with_args_and_detail_parsed() -> None:
    doc = job_to_json(info(dag(node("cordon", "done"), node("drain", "running", deps=("cordon",)))))
    assert list(doc) == [
        "id",
        "template",
        "state",
        "terminal",
        "subjects",
        "args",
        "requested_by",
        "reason",
        "first_error",
        "cancel_requested",
        "created_at_ms",
        "settled_at_ms",
        "nodes",
        "awaiting_approval",
    ]
    assert doc["args"] == {"max_parallel": 2} and doc["created_at_ms"] == 1_700_000_000_000
    drain = doc["nodes"][1]
    assert list(drain) == [
        "id",
        "kind",
        "subject",
        "state",
        "error",
        "deps",
        "group",
        "tail",
        "detail",
        "started_at_ms",
        "finished_at_ms",
    ]
    assert drain["deps"] == [{"node": "cordon", "when": "after_ok"}] and drain["detail"] == {"command_id": "c-1"}
    json.dumps(doc)


def test_show_renders_a_node_table() -> None:
    text = render_job(info(dag(node("cordon", "done"), node("drain", "running", deps=("cordon",)))))
    lines = list(text)
    header = next(i for i, line in enumerate(lines) if line.startswith("NODE"))
    assert lines[header].split() == ["NODE", "KIND", "SUBJECT", "STATE", "DEPS", "ERROR/DETAIL"]
    assert lines[header + 2].split() == ["drain", "Command", "n1", "▶", "running", "cordon", "command_id=c-1"]


# -- bc jobs slots --set --------------------------------------------------------------------------------


def test_parse_slot() -> None:
    assert parse_slot("reboots=2") == ("reboots", 2)
    for bad in ("reboots", "=2", "reboots=x", "reboots=-1", "reboots=0", "reboots=10001"):
        with pytest.raises(UsageError):
            parse_slot(bad)


# -- refused before any call: one line, exit 2 ------------------------------------------------------------


@pytest.mark.parametrize(
    "args, sentence",
    [
        (["jobs", "run", "defrag", "n1"], "there is no job template 'defrag'"),
        (["jobs", "run", "reboot", "n1", "--max-parallel", "0"], "--max-parallel"),
        (["jobs", "run", "reboot"], "NODE..."),
        (
            ["jobs", "run", "rollout", "--section", "host", "--file", "/nonexistent.json", "--nodes", "n1"],
            "cannot read",
        ),
        # A device is not a file to read (issue 29): refused before reading, as a FIFO or /dev/zero would be.
        (["jobs", "run", "rollout", "--section", "host", "--file", "/dev/null", "--nodes", "n1"], "not a regular file"),
        (["jobs", "run", "rollout", "--section", "host", "--file", "/dev/null", "--nodes", ""], "comma-separated"),
        (["jobs", "run", "drain", "n1", "--deadline", "soon"], "is not a duration"),
        (["jobs", "slots", "--set", "reboots=0"], "between 1 and 10,000"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args: list[str], sentence: str) -> None:
    r = CliRunner().invoke(cli, args, prog_name="bc", env={"BC_CONFIG": "/nonexistent/config.json"})
    assert r.exit_code == 2, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and sentence in lines[0], r.stderr


# -- the API's bounds ------------------------------------------------------------------------------------


def test_the_request_maps_with_the_templates_defaults() -> None:
    req = job_views.job_request(admin_pb2.SubmitJobRequest(template="reboot", nodes=["n1", "n2"]))
    assert req == JobRequest(template="reboot", nodes=("n1", "n2"))
    req = job_views.job_request(admin_pb2.SubmitJobRequest(template="reboot", nodes=["n1"], max_parallel=2))
    assert req.max_parallel == 2


@pytest.mark.parametrize(
    "request_, sentence",
    [
        (admin_pb2.SubmitJobRequest(template="defrag"), "there is no job template 'defrag'"),
        (admin_pb2.SubmitJobRequest(template="reboot", nodes=["n1"], max_parallel=0), "--max-parallel must be"),
        (admin_pb2.SubmitJobRequest(template="rollout", nodes=["n1"], max_unavailable=-1), "--max-unavailable"),
        (admin_pb2.SubmitJobRequest(template="drain", nodes=["n1"], deadline_s=0), "--deadline"),
        (admin_pb2.SubmitJobRequest(template="reboot", nodes=["n"] * 10_001), "max_batch_nodes"),
        (admin_pb2.SubmitJobRequest(template="rollout", nodes=["n1"], section_json="x" * 300_000), "max_section"),
    ],
)
def test_the_api_refuses_out_of_range_requests(request_: admin_pb2.SubmitJobRequest, sentence: str) -> None:
    with pytest.raises(UsageError, match=sentence):
        job_views.job_request(request_)


def test_slot_settings_are_all_checked_before_any_applies() -> None:
    pools = [PoolView("reboots", 4, 0), PoolView("rollouts", 1, 0)]
    assert job_views.slot_settings({"rollouts": 2, "reboots": 3}, pools) == [("reboots", 3), ("rollouts", 2)]
    with pytest.raises(UsageError, match="no slot pool 'nope'"):
        job_views.slot_settings({"reboots": 3, "nope": 1}, pools)
    with pytest.raises(UsageError, match="between 1 and"):
        job_views.slot_settings({"reboots": 0}, pools)


def test_a_list_over_the_frame_leaves_out_the_oldest_ended_dags_first() -> None:
    big = "x" * 1000
    live = dag(node("a", "running", error=big))
    ended = [dag(node("a", "done", error=big), state="done", terminal=True) for _ in range(3)]
    one = job_views.job_info(live).ByteSize() + 8
    kept, omitted = job_views.jobs_within([ended[0], live, ended[1], ended[2]], budget=2 * one + 10)
    assert omitted == 2 and [k.terminal for k in kept] == [False, True]


def test_a_job_that_cordons_needs_admin_whatever_the_route() -> None:
    drain = ("admin", "running a drain job: cordoning a node")
    assert needed("SubmitJob", admin_pb2.SubmitJobRequest(template="drain", nodes=["n1"])) == drain
    reboot = ("operator", "running a job")
    assert needed("SubmitJob", admin_pb2.SubmitJobRequest(template="reboot", nodes=["n1"])) == reboot
    cordon = ("admin", "running a cordon job: cordoning a node")
    assert needed("SubmitJob", admin_pb2.SubmitJobRequest(template="cordon")) == cordon
    uncordon = ("admin", "running an uncordon job: uncordoning a node")
    assert needed("SubmitJob", admin_pb2.SubmitJobRequest(template="uncordon", nodes=["n1"])) == uncordon
    assert needed("CordonNode", admin_pb2.CordonNodeRequest(node_id="n1")) == ("admin", "cordoning a node")
    assert needed("JobSlots")[0] == "admin" and needed("WatchJob")[0] == "viewer"


def test_a_job_waiting_for_its_quorum_says_which_batch_and_how_many_signed() -> None:
    from dataclasses import replace

    from bc.jobs.views import ApprovalWait

    waiting = replace(
        dag(node("batch:2", "running"), node("cmd:n3", "queued")),
        awaiting_approval=(ApprovalWait("batch:2", "b-2", 1, 2),),
    )
    job = info(waiting)
    assert progress_line(job).endswith("(awaiting approval: batch b-2, 1 of 2 signed)"), progress_line(job)
    assert "\nawaiting approval: batch b-2, 1 of 2 signed\n" in str(render_job(job))
    assert job_to_json(job)["awaiting_approval"] == [{"node": "batch:2", "batch_id": "b-2", "signed": 1, "needed": 2}]
    assert "awaiting" not in str(render_job(info(dag(node("batch", "done")))))
