"""Jobs end to end (issue 12, docs/jobs.md): `bc serve`, `bc node` and the operators' `bc`, all real processes.

What an operator could observe, through the CLI (`--json`) and the fake hardware's own counters:

* `bc jobs run reboot n1 n2 n3 n4 --max-parallel 2` never has more than two nodes out at once (read
  back from the event log: each node's group claimed, its reboot command settled), and each node
  reboots exactly once (`fake-reboots.json`, a new boot id, one `node.reboot` accepted); without
  approvers the job sends each command itself, with them it asks for one batch per wave of two when
  the wave is due, a batch's approval releases nothing, and the job releases at most two leaves at a time;
* `bc jobs run remediate` waits for the quorum, and its batch shows the job and how it resolved it:
  done after a success (one GPU reset), failed after a rejection, and cancelled (the batch withdrawn)
  after `bc jobs cancel` (no reset either time; `bc jobs run` exits 8 with the one-line reason);
* `bc serve` killed (SIGKILL) mid rolling reboot and mid GPU reset: after a restart on the same data
  dir each DAG completes and each command was sent once (one reboot, one reset per node);
* a rollout of a section the nodes answer UNSUPPORTED stops at its first node with that reason.

The cases share one lab (four nodes; three approvers with k = 2 once a case asks for them, so the
reboots that come first take the path without a batch): none leaves a job live or a node out, and each
counts side effects as differences from what it saw before it started. n4's fake GPU resets take
`SLOW_RESET_S`, so a kill can land while one runs.
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import pytest

from .harness import (
    Lab,
    always,
    assert_no_tracebacks,
    fake_boot_id,
    fake_reboots,
    fake_resets,
    job_brief,
    job_node,
)
from .test_commands import first_gpu, log_lines, node_log, wait_reconnected
from .test_quorum import Approver, add_approvers, sign, wait_approvers_held

NODES = ("n1", "n2", "n3", "n4")
SLOW_RESET_S = 4.0
NODE_TERMINAL = ("done", "failed", "cancelled")

pytestmark = pytest.mark.e2e


@dataclass
class Fleet:
    lab: Lab
    gpus: dict[str, str]  # each node's first GPU
    approvers: dict[str, Approver] = field(default_factory=dict)  # none until `with_quorum`


@pytest.fixture(scope="module")
def fleet_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    lab = Lab(tmp_path_factory.mktemp("jobs"))
    try:
        lab.serve()
        for n in NODES:
            lab.join(n)
            lab.node(n, env={"BC_FAKE_GPU_RESET_S": str(SLOW_RESET_S)} if n == "n4" else None)
        for n in NODES:
            lab.wait_converged(n)
        yield Fleet(lab, {n: first_gpu(lab, n) for n in NODES})
    finally:
        lab.close()


@pytest.fixture
def fleet(fleet_lab: Fleet) -> Iterator[Fleet]:
    """The shared lab; its logs are printed after each case (shown only when it fails)."""
    if not fleet_lab.lab.running("serve"):
        fleet_lab.lab.restart("serve")  # an earlier case failed between its kill and its restart
    yield fleet_lab
    print(fleet_lab.lab.dump_logs())


# -- helpers ---------------------------------------------------------------------------------------


def with_quorum(fleet: Fleet) -> Fleet:
    """Three approvers, k = 2 (as test_quorum sets them up), held by every node; once per lab."""
    if not fleet.approvers:
        fleet.approvers = add_approvers(fleet.lab)
        wait_approvers_held(fleet.lab, list(NODES), 3, 2)
    return fleet


def submit(lab: Lab, template: str, *args: str) -> dict[str, Any]:
    """`bc jobs run TEMPLATE ARGS --no-wait --json`: the DAG document as stored."""
    doc = lab.bc("jobs", "run", template, *args, "--no-wait")
    assert isinstance(doc, dict) and doc["id"].startswith("j-") and doc["template"] == template, doc
    return doc


def batch_started(lab: Lab, dag_id: str) -> str:
    """Wait until the DAG's Batch node runs (its batch created, waiting for the quorum); the batch id."""
    doc = lab.wait_job(dag_id, "its batch created", lambda d: job_node(d, "batch")["state"] == "running")
    batch_id = job_node(doc, "batch")["detail"].get("batch_id", "")
    assert batch_id.startswith("b-"), job_brief(doc)
    return str(batch_id)


def run_to_end(fleet: Fleet, dag_id: str, timeout: float = 90.0) -> dict[str, Any]:
    """Wait for the DAG to be terminal, approving each batch it asks for when it asks (alice and bob)."""
    approved: set[str] = set()

    def check() -> dict[str, Any] | None:
        doc = fleet.lab.job(dag_id)
        for a in doc.get("awaiting_approval", []):
            if a["batch_id"] not in approved:
                approve(fleet, a["batch_id"])
                approved.add(a["batch_id"])
        return doc if doc.get("terminal") else None

    return fleet.lab.wait_for(f"job {dag_id} to end, its batches approved as they come due", check, timeout)


def batch(lab: Lab, batch_id: str) -> dict[str, Any]:
    doc = lab.bc("batch", "show", batch_id)
    assert isinstance(doc, dict) and doc["id"] == batch_id, doc
    return doc


def approve(fleet: Fleet, batch_id: str) -> None:
    """alice and bob sign (k = 2): the batch is approved."""
    sign(fleet.lab, batch_id, fleet.approvers["alice"])
    assert sign(fleet.lab, batch_id, fleet.approvers["bob"])["state"] == "approved"


def states(doc: dict[str, Any]) -> dict[str, str]:
    return {n["id"]: n["state"] for n in doc["nodes"]}


def commands_of(lab: Lab, node_id: str, kind: str) -> list[dict[str, Any]]:
    """The node's commands of `kind` (`bc cmd list --node`), newest first."""
    return [c for c in lab.bc("cmd", "list", "--node", node_id, "--limit", "1000") if c["kind"] == kind]


def out_of_service(events: list[dict[str, Any]], dag_id: str) -> tuple[int, int]:
    """From the DAG's `job.node` events in log order: the most nodes out at once (each node from its group
    `reboot:n` claimed until its `cmd:n` settled) and the most reboot commands in flight at once."""
    out: set[str] = set()
    rebooting: set[str] = set()
    peak_out = peak_rebooting = 0
    for e in sorted(events, key=lambda e: int(e["seq"])):
        if e["type"] != "job.node" or e["subject"] != dag_id:
            continue
        kind, _, subject = str(e["data"]["node"]).partition(":")
        state = e["data"]["state"]
        if kind == "reboot" and state == "running":
            out.add(subject)
        elif kind == "cmd" and state == "running":
            rebooting.add(subject)
        elif kind == "cmd" and state in NODE_TERMINAL:
            out.discard(subject)
            rebooting.discard(subject)
        peak_out, peak_rebooting = max(peak_out, len(out)), max(peak_rebooting, len(rebooting))
    return peak_out, peak_rebooting


@dataclass(frozen=True)
class Before:
    """What each node looked like before a case: reboots started, boot id, session, node.reboot commands."""

    reboots: dict[str, int]
    boot_ids: dict[str, str]
    epochs: dict[str, int]
    reboot_cmds: dict[str, int]

    @classmethod
    def take(cls, lab: Lab) -> Before:
        shown = {n: lab.show(n) for n in NODES}
        return cls(
            {n: fake_reboots(lab, n) for n in NODES},
            {n: str(shown[n]["boot_id"]) for n in NODES},
            {n: int(shown[n]["session_epoch"]) for n in NODES},
            {n: len(commands_of(lab, n, "node.reboot")) for n in NODES},
        )


LOG_TS = re.compile(r"^ts=(\S+ \S+) ")


def log_time(line: str) -> datetime:
    m = LOG_TS.match(line)
    assert m, f"no timestamp in {line!r}"
    return datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f")


def peak_overlap(intervals: list[tuple[Any, Any]]) -> int:
    """The most half-open [start, end) intervals that hold at one instant."""
    edges = sorted([(end, -1) for _, end in intervals] + [(start, 1) for start, _ in intervals])
    peak = now = 0
    for _, step in edges:  # an end sorts before a start at the same instant
        now += step
        peak = max(peak, now)
    return peak


def assert_never_past_max_parallel(lab: Lab, dag: dict[str, Any], *, both_seen: bool = True) -> None:
    """At most 2 nodes out at once, seen three ways: the DAG's `job.node` events in log order (a node is out
    from its group claimed to its reboot command settled; its command in flight from `cmd:n` running),
    and each node's own log (a reboot from `command.accepted` to `command.recovered` in the next boot).
    With `both_seen`, the job had two out at once: the bound is not met by running one at a time (the nodes'
    own overlap is only bounded: the second reboot's dispatch could in principle trail the first's reboot)."""
    out, in_flight = out_of_service(lab.events("job.node"), dag["id"])
    by_nodes: dict[str, tuple[datetime, datetime]] = {}
    for n in NODES:
        cid = job_node(dag, f"cmd:{n}")["detail"]["command_id"]
        accepted = log_lines(lab, cid, "command.accepted", node_id=n)
        recovered = [
            line for line in node_log(lab, n).splitlines() if f"event=command.recovered command={cid} " in line
        ]
        assert len(accepted) == len(recovered) == 1, f"{n}'s log for {cid}:\n" + "\n".join(accepted + recovered)
        by_nodes[n] = (log_time(accepted[0]), log_time(recovered[0]))
    on_nodes = peak_overlap(list(by_nodes.values()))
    shown = {n: f"{a:%H:%M:%S.%f}"[:-3] + "-" + f"{b:%H:%M:%S.%f}"[:-3] for n, (a, b) in by_nodes.items()}
    ok = max(out, in_flight, on_nodes) <= 2 and (not both_seen or (out, in_flight) == (2, 2))
    assert ok, (
        f"at most: {out} nodes out, {in_flight} reboot commands in flight (job events), "
        f"{on_nodes} nodes rebooting (their logs: {shown})"
    )


def start_reboot(fleet: Fleet, before: Before) -> tuple[dict[str, Any], str]:
    """`bc jobs run reboot n1 n2 n3 n4 --max-parallel 2 --no-wait`; with approvers, its first wave's batch
    is approved (nothing rebooted before that; the second wave's is asked for when it is due: `run_to_end`).
    The DAG and its first batch id ("" without approvers)."""
    lab = fleet.lab
    dag = submit(lab, "reboot", *NODES, "--max-parallel", "2")
    assert dag["subjects"] == list(NODES), dag
    if not fleet.approvers:
        assert not [k for k in states(dag) if k.startswith("batch")], job_brief(dag)
        return dag, ""
    doc = lab.wait_job(dag["id"], "its first batch created", lambda d: bool(d["awaiting_approval"]))
    (waiting,) = doc["awaiting_approval"]  # one node.reboot batch per wave: the first wave's only, for now
    assert (waiting["node"], waiting["signed"], waiting["needed"]) == ("batch:1", 0, 2), waiting
    assert job_node(doc, "batch:2")["state"] == "queued", job_brief(doc)
    out = {k: v for k, v in states(doc).items() if k.startswith(("reboot:", "drain:", "cmd:"))}
    assert set(out.values()) == {"queued"}, job_brief(doc)
    assert {n: fake_reboots(lab, n) for n in NODES} == before.reboots, "a node rebooted before the quorum"
    approve(fleet, waiting["batch_id"])
    return dag, str(waiting["batch_id"])


def assert_rebooted_once_each(lab: Lab, before: Before, dag: dict[str, Any], batch_id: str) -> None:
    """Each node: one more fake reboot started, a new boot id, one more node.reboot command (the DAG's:
    its own idempotency key, or its leaf of its wave's batch; succeeded, accepted once by the node), and
    back in service: connected, not cordoned. `batch_id`: the first wave's batch ("" without approvers)."""
    for n in NODES:
        assert fake_reboots(lab, n) == before.reboots[n] + 1, (
            f"{n} started {fake_reboots(lab, n) - before.reboots[n]} reboots"
        )
        cid = job_node(dag, f"cmd:{n}")["detail"]["command_id"]
        cmd = lab.bc("cmd", "show", cid)
        assert (cmd["kind"], cmd["state"], cmd["reason"]) == ("node.reboot", "succeeded", "rebooted"), cmd
        if batch_id:
            wave = "batch:1" if n in NODES[:2] else "batch:2"
            assert cmd["batch_id"] == job_node(dag, wave)["detail"]["batch_id"], (wave, cmd)
            assert (cmd["batch_id"] == batch_id) == (wave == "batch:1"), cmd
        else:
            assert (cmd["batch_id"], cmd["idempotency_key"]) == ("", f"job:{dag['id']}:cmd:{n}"), cmd
        assert len(commands_of(lab, n, "node.reboot")) == before.reboot_cmds[n] + 1, f"{n} got a second node.reboot"
        accepted = log_lines(lab, cid, "command.accepted", node_id=n)
        assert len(accepted) == 1, f"{n} accepted {cid} {len(accepted)} times:\n" + "\n".join(accepted)
        doc = wait_reconnected(lab, n, before.epochs[n])
        assert doc["boot_id"] == fake_boot_id(lab, n) != before.boot_ids[n], (n, doc["boot_id"], before.boot_ids[n])
        assert cmd["boot_id"] == doc["boot_id"], f"{n}: the reboot settled from boot {cmd['boot_id']}, not the new one"
        assert doc["cordoned"] is False, f"{n} stayed cordoned after the reboot job"


# -- rolling reboots: never past --max-parallel, each node once, across a kill -9 of bc serve ----------


def test_a_rolling_reboot_never_has_more_than_max_parallel_nodes_out_and_reboots_each_once(fleet: Fleet) -> None:
    lab = fleet.lab  # no approvers yet (unless this case runs alone after others): the job sends each reboot
    before = Before.take(lab)
    dag, bid = start_reboot(fleet, before)

    done = run_to_end(fleet, dag["id"])
    assert done["state"] == "done" and set(states(done).values()) == {"done"}, job_brief(done)
    assert_never_past_max_parallel(lab, done)
    assert_rebooted_once_each(lab, before, done, bid)
    assert_no_tracebacks(lab)


def test_a_rolling_reboot_survives_a_kill_9_of_bc_serve_and_reboots_each_node_once(fleet: Fleet) -> None:
    lab = fleet.lab
    before = Before.take(lab)
    dag, bid = start_reboot(fleet, before)

    # The first reboot started (counted by the node before it re-executes): serve dies under it.
    first = lab.wait_for(
        "a node's reboot to start",
        lambda: [n for n in NODES if fake_reboots(lab, n) > before.reboots[n]],
        interval=0.01,
    )
    lab.kill("serve")
    started = sum(fake_reboots(lab, n) - before.reboots[n] for n in NODES)
    assert started < len(NODES), f"all {started} reboots had started before the kill ({first} first)"
    lab.restart("serve")

    done = run_to_end(fleet, dag["id"])
    assert done["state"] == "done" and set(states(done).values()) == {"done"}, job_brief(done)
    assert_rebooted_once_each(lab, before, done, bid)
    assert_never_past_max_parallel(lab, done, both_seen=False)  # a reboot sent after the restart may start late
    assert_no_tracebacks(lab)


def test_under_a_quorum_a_rolling_reboot_asks_for_a_batch_per_wave_and_releases_no_more_than_max_parallel(
    fleet: Fleet,
) -> None:
    lab = with_quorum(fleet).lab
    before = Before.take(lab)
    dag, bid = start_reboot(fleet, before)

    def at_most_two_released() -> bool:
        bids = [n["detail"].get("batch_id", "") for n in lab.job(dag["id"])["nodes"] if n["kind"] == "Batch"]
        leaves = [leaf for b in bids if b for leaf in batch(lab, b)["leaves"]]
        return sum(1 for leaf in leaves if leaf["command_state"] not in ("pending", "succeeded")) <= 2

    with always("at most 2 of the batches' reboots released and unsettled", at_most_two_released, interval=0.05):
        done = run_to_end(fleet, dag["id"])
    assert done["state"] == "done" and set(states(done).values()) == {"done"}, job_brief(done)
    assert_never_past_max_parallel(lab, done)
    assert_rebooted_once_each(lab, before, done, bid)
    for wave, nodes in (("batch:1", NODES[:2]), ("batch:2", NODES[2:])):
        b = batch(lab, job_node(done, wave)["detail"]["batch_id"])
        assert (b["state"], b["dag_id"], b["resolution"]) == ("approved", dag["id"], "done"), b
        assert [leaf["node_id"] for leaf in b["leaves"]] == list(nodes), b["leaves"]
        assert {leaf["command_state"] for leaf in b["leaves"]} == {"succeeded"}, b["leaves"]
    # The second wave's batch was asked for when the first wave had ended, not at the job's start.
    first_done = max(job_node(done, f"reboot:{n}")["finished_at_ms"] for n in NODES[:2])
    assert job_node(done, "batch:2")["started_at_ms"] >= first_done, job_brief(done)
    assert_no_tracebacks(lab)


# -- remediate: the quorum, and its approval resolved on success, rejection and cancel -------------------


def test_remediate_waits_for_the_quorum_resets_once_and_resolves_its_batch_done(fleet: Fleet) -> None:
    lab, gpu = with_quorum(fleet).lab, fleet.gpus["n1"]
    before = fake_resets(lab, "n1")
    dag = submit(lab, "remediate", "n1", "--gpus", gpu, "--reason", "XID 79")
    bid = batch_started(lab, dag["id"])
    b = batch(lab, bid)
    assert (b["state"], b["kind"], b["dag_id"], b["resolution"]) == ("pending", "gpu.reset", dag["id"], ""), b

    sign(lab, bid, fleet.approvers["alice"])
    # One approval of two: held, not merely slow. A later command on n1 runs and succeeds past it.
    assert lab.bc("cmd", "run", "n1", "inventory.refresh", "--wait")["state"] == "succeeded"
    waiting = lab.job(dag["id"])
    assert (job_node(waiting, "batch")["state"], job_node(waiting, "reset:n1")["state"]) == ("running", "queued"), (
        job_brief(waiting)
    )
    assert fake_resets(lab, "n1") == before

    assert sign(lab, bid, fleet.approvers["bob"])["state"] == "approved"
    done = lab.wait_job_terminal(dag["id"])
    assert done["state"] == "done" and set(states(done).values()) == {"done"}, job_brief(done)
    assert fake_resets(lab, "n1") == {**before, gpu: before.get(gpu, 0) + 1}
    reset_cmd = job_node(done, "reset:n1")["detail"]["command_id"]
    assert len(log_lines(lab, reset_cmd, "command.accepted", node_id="n1")) == 1
    diag = lab.bc("cmd", "show", job_node(done, "diag:n1")["detail"]["command_id"])
    assert (diag["kind"], diag["state"]) == ("diag.nvml", "succeeded"), diag

    b = batch(lab, bid)
    assert (b["state"], b["resolution"]) == ("approved", "done"), b
    assert [(leaf["command_id"], leaf["command_state"]) for leaf in b["leaves"]] == [(reset_cmd, "succeeded")]
    assert "resolved done" in lab.bc("batch", "show", bid, json=False)  # what `bc batch show` prints for a job's batch
    assert lab.show("n1")["cordoned"] is False
    assert_no_tracebacks(lab)


@contextlib.contextmanager
def followed_remediation(fleet: Fleet) -> Iterator[tuple[dict[str, Any], str, Callable[[], list[str]]]]:
    """`bc jobs run remediate n1 --gpus GPU` as an operator runs it (following the job until it ends), started
    in the background; yields the DAG once listed, its batch id (waiting for the quorum) and `ended()`, which
    waits for the command to exit 8 and returns its `error:` lines."""
    lab = fleet.lab
    follower = subprocess.Popen(
        [lab.bc_path, "jobs", "run", "remediate", "n1", "--gpus", fleet.gpus["n1"]],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=lab.env,
    )

    def ended() -> list[str]:
        out, err = follower.communicate(timeout=60)
        assert follower.returncode == 8, f"exited {follower.returncode}: stdout={out!r} stderr={err!r}"
        return [line for line in err.splitlines() if line.startswith("error:")]

    try:
        live = lab.wait_for(
            "the remediate job listed",
            lambda: [j for j in lab.bc("jobs", "list") if j["template"] == "remediate" and not j["terminal"]],
        )
        (dag,) = live
        yield dag, batch_started(lab, dag["id"]), ended
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.communicate()


def test_remediate_whose_batch_is_rejected_fails_with_the_reason_and_never_resets(fleet: Fleet) -> None:
    lab = with_quorum(fleet).lab
    before = fake_resets(lab, "n1")
    with followed_remediation(fleet) as (dag, bid, ended):
        sign(lab, bid, fleet.approvers["alice"])
        bob = fleet.approvers["bob"]
        rejected = lab.bc("approve", "reject", bid, "--key", str(bob.key), "--reason", "wrong GPU", env=bob.env())
        assert rejected["state"] == "rejected", rejected
        errors = ended()
    assert errors == [f"error: job {dag['id']} (remediate n1) failed: batch {bid} was rejected"], errors

    done = lab.job(dag["id"])
    assert done["terminal"] and done["state"] == "failed", job_brief(done)
    assert (job_node(done, "reset:n1")["state"], job_node(done, "diag:n1")["state"]) == ("cancelled", "cancelled")
    assert job_node(done, "resolve")["state"] == "done" and job_node(done, "reconcile:n1")["state"] == "done"
    b = batch(lab, bid)
    assert (b["state"], b["dag_id"], b["resolution"]) == ("rejected", dag["id"], "failed"), b
    leaf_cmd = lab.bc("cmd", "show", b["leaves"][0]["command_id"])
    assert (leaf_cmd["state"], leaf_cmd["reason"]) == ("cancelled", "batch-rejected"), leaf_cmd
    assert log_lines(lab, leaf_cmd["id"], "command.accepted", node_id="n1") == []
    assert fake_resets(lab, "n1") == before, "a rejected remediation reset a GPU"
    assert lab.show("n1")["cordoned"] is False
    assert_no_tracebacks(lab)


def test_remediate_cancelled_while_waiting_for_the_quorum_ends_cancelled_and_withdraws_its_batch(
    fleet: Fleet,
) -> None:
    lab = with_quorum(fleet).lab
    before = fake_resets(lab, "n1")
    with followed_remediation(fleet) as (dag, bid, ended):
        sign(lab, bid, fleet.approvers["alice"])  # one approval of two: still waiting
        answer = lab.bc("jobs", "cancel", dag["id"])
        assert answer["cancelled"] is True and answer["job"]["cancel_requested"] is True, answer
        errors = ended()
    assert len(errors) == 1 and errors[0].startswith(f"error: job {dag['id']} (remediate n1) cancelled"), errors

    done = lab.job(dag["id"])
    assert done["terminal"] and done["state"] == "cancelled" and done["cancel_requested"], job_brief(done)
    assert {k: v for k, v in states(done).items() if k in ("batch", "reset:n1", "diag:n1")} == {
        "batch": "cancelled",
        "reset:n1": "cancelled",
        "diag:n1": "cancelled",
    }, job_brief(done)
    assert job_node(done, "resolve")["state"] == "done" and job_node(done, "reconcile:n1")["state"] == "done"
    b = batch(lab, bid)
    assert (b["state"], b["dag_id"], b["resolution"]) == ("withdrawn", dag["id"], "cancelled"), b
    leaf_cmd = lab.bc("cmd", "show", b["leaves"][0]["command_id"])
    assert (leaf_cmd["state"], leaf_cmd["reason"]) == ("cancelled", "batch-withdrawn"), leaf_cmd
    # A withdrawn batch can no longer be approved: bob's signature is refused and releases nothing.
    bob = fleet.approvers["bob"]
    late = lab.run("approve", "sign", bid, "--key", str(bob.key), "--yes", env=bob.env())
    assert late.returncode != 0 and "withdrawn" in late.stderr, late.stderr
    assert lab.bc("cmd", "show", leaf_cmd["id"])["state"] == "cancelled"
    assert log_lines(lab, leaf_cmd["id"], "command.accepted", node_id="n1") == []
    assert fake_resets(lab, "n1") == before, "a cancelled remediation reset a GPU"
    assert lab.show("n1")["cordoned"] is False
    assert_no_tracebacks(lab)


# -- bc serve killed mid-reset: the remediation completes, one reset --------------------------------


def test_a_remediation_survives_a_kill_9_of_bc_serve_mid_reset_and_resets_once(fleet: Fleet) -> None:
    lab, gpu = with_quorum(fleet).lab, fleet.gpus["n4"]  # n4's resets take SLOW_RESET_S
    before = fake_resets(lab, "n4")
    resets_before = len(commands_of(lab, "n4", "gpu.reset"))
    dag = submit(lab, "remediate", "n4", "--gpus", gpu)
    approve(fleet, batch_started(lab, dag["id"]))

    lab.wait_for("n4's GPU reset to start", lambda: fake_resets(lab, "n4").get(gpu, 0) > before.get(gpu, 0))
    lab.kill("serve")
    lab.restart("serve")

    done = lab.wait_job_terminal(dag["id"], timeout=60)
    assert done["state"] == "done" and set(states(done).values()) == {"done"}, job_brief(done)
    assert fake_resets(lab, "n4") == {**before, gpu: before.get(gpu, 0) + 1}, "the reset ran again"
    reset_cmd = job_node(done, "reset:n4")["detail"]["command_id"]
    assert lab.bc("cmd", "show", reset_cmd)["state"] == "succeeded"
    assert len(log_lines(lab, reset_cmd, "command.accepted", node_id="n4")) == 1
    assert len(commands_of(lab, "n4", "gpu.reset")) == resets_before + 1, "a second gpu.reset was sent"
    diag_cmd = job_node(done, "diag:n4")["detail"]["command_id"]
    assert [c["id"] for c in commands_of(lab, "n4", "diag.nvml")][:1] == [diag_cmd]
    assert len(log_lines(lab, diag_cmd, "command.accepted", node_id="n4")) == 1
    b = batch(lab, job_node(done, "batch")["detail"]["batch_id"])
    assert (b["state"], b["resolution"]) == ("approved", "done"), b
    assert_no_tracebacks(lab)


# -- a rollout of a section the nodes do not support ------------------------------------------------


def test_a_rollout_of_an_unsupported_section_stops_at_its_first_node_with_the_reason(fleet: Fleet) -> None:
    lab = fleet.lab
    # A GPU node has no site converger (only an agent of the `site` role does, docs/metal.md); cached images are
    # an operator's part of the section. (A host unit no one knows, e.g. chrony, is root-equivalent: a rollout
    # refuses it before any write, tests/security/test_sec_rootequiv_operator_host.py.)
    section = lab.root / "site.json"
    section.write_text(json.dumps({"cacheImages": [{"url": "https://img.example/u.img", "sha256": "b" * 64}]}))
    generations = {n: int(lab.show(n)["generation"]) for n in NODES}

    r = lab.run(
        "jobs", "run", "rollout", "--section", "site", "--file", str(section), "--nodes", "n2,n1,n3", timeout=60
    )
    assert r.returncode == 8, f"exited {r.returncode}: stdout={r.stdout!r} stderr={r.stderr!r}"
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, r.stderr
    assert "failed: node n2 answered site UNSUPPORTED" in errors[0], errors[0]

    (dag,) = [j for j in lab.bc("jobs", "list") if j["template"] == "rollout"]
    assert dag["terminal"] and dag["state"] == "failed", job_brief(dag)
    assert "node n2 answered site UNSUPPORTED" in dag["first_error"], dag["first_error"]
    s = states(dag)
    assert (s["patch:n2"], s["patch:n1"], s["patch:n3"]) == ("failed", "cancelled", "cancelled"), job_brief(dag)
    assert lab.wait_converged("n2", generations["n2"] + 1)["sections"], "n2 observed its patch"
    for n in ("n1", "n3", "n4"):
        assert int(lab.show(n)["generation"]) == generations[n], f"{n}'s spec changed"
    assert_no_tracebacks(lab)


def test_the_shared_lab_ends_with_no_live_job(fleet: Fleet) -> None:
    """Every DAG the cases ran is terminal and holds nothing: no slot of any pool is held."""
    live = [j for j in fleet.lab.bc("jobs", "list", "--all") if not j["terminal"]]
    assert not live, [job_brief(j) for j in live]
    pools = fleet.lab.bc("jobs", "slots")
    assert all(p["held"] == 0 for p in pools), pools
