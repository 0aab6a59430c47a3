"""One-shot commands end to end: crash recovery, duplicates, expiry, lanes and credits, `--wait`.

What the reference promises ("Commands", "Duplicates and crash recovery", "Daemon
crash or node reboot", "Journal loss"), checked with the installed `bc` only:

* a command that is not retry-safe and was interrupted by a crash is `failed`
  with `interrupted` and never runs again; a retry-safe one is redelivered and
  runs again;
* a fake `node.reboot` is `succeeded` with `rebooted` from the next boot;
* a command delivered twice (the server restarted under it) runs once;
* a command whose `not_after` passes while its node is away is `expired` and
  never runs;
* a burst keeps the order within a lane and the lane's credits (8) and
  workers (4);
* a lost journal fails what was in flight and not retry-safe with `journal-lost`;
* `bc cmd run --wait` exits 0 only when the command succeeded.

The fake hardware's side effects are counted by the node itself
(`fake-gpu-resets.json` in its data dir), and what the node did is read from its
log (`event=command.accepted|running|settled command=<id>`).
"""

from __future__ import annotations

import itertools
import json
import re
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from .harness import Lab, WaitTimeout, assert_no_tracebacks, bring_up

TERMINAL = ("succeeded", "failed", "rejected", "cancelled", "expired")

#: `event=... command=<id>` in the node's log.
LOG_EVENT = re.compile(r"event=(command\.[a-z-]+) command=(\S+)")


# -- helpers ---------------------------------------------------------------------------


def node_log(lab: Lab, node_id: str = "n1") -> str:
    """Everything the node's processes logged (all starts, and re-executions, of `bc node`)."""
    return lab.log(f"node-{node_id}")


def log_lines(lab: Lab, command_id: str, event: str, node_id: str = "n1") -> list[str]:
    """The node's log lines for `event` (e.g. `command.accepted`) of one command."""
    needle = f"event={event} command={command_id} "
    return [line for line in node_log(lab, node_id).splitlines() if needle in line]


def session_ends(lab: Lab, node_id: str = "n1") -> list[str]:
    """The node's log lines saying its session ended (or was closed by the gateway)."""
    lines = node_log(lab, node_id).splitlines()
    return [
        line.split(" event=", 1)[-1]
        for line in lines
        if "event=session.ended" in line or "event=session.closed" in line
    ]


def resets(lab: Lab, node_id: str = "n1") -> dict[str, int]:
    """The fake GPU resets the node started, by GPU uuid."""
    path = lab.node_dir(node_id) / "fake-gpu-resets.json"
    return json.loads(path.read_text()) if path.exists() else {}


def first_gpu(lab: Lab, node_id: str = "n1") -> str:
    gpus = lab.show(node_id)["inventory"]["gpus"]
    assert gpus, f"{node_id} reports no GPUs"
    return str(gpus[0]["uuid"])


def run(lab: Lab, node_id: str, kind: str, *args: str) -> dict[str, Any]:
    """`bc cmd run NODE KIND ARGS --json`: the queued command."""
    doc = lab.bc("cmd", "run", node_id, kind, *args)
    assert isinstance(doc, dict) and doc.get("id") and doc.get("kind") == kind, doc
    return doc


def show(lab: Lab, command_id: str) -> dict[str, Any]:
    doc = lab.bc("cmd", "show", command_id)
    assert isinstance(doc, dict) and doc.get("id") == command_id, doc
    return doc


def wait_state(lab: Lab, command_id: str, *states: str, timeout: float = 20.0) -> dict[str, Any]:
    """Wait until the command is in one of `states`; the timeout says where it was instead."""
    seen: list[str] = []

    def check() -> dict[str, Any] | None:
        doc = show(lab, command_id)
        label = f"{doc['state']}({doc['reason']})" if doc.get("reason") else str(doc["state"])
        if not seen or seen[-1] != label:
            seen.append(label)
        return doc if doc["state"] in states else None

    try:
        return lab.wait_for(f"command {command_id} {'|'.join(states)}", check, timeout=timeout)
    except WaitTimeout as e:
        raise WaitTimeout(f"{e}; states seen: {' -> '.join(seen)}") from None


def wait_settled(lab: Lab, command_id: str, timeout: float = 20.0) -> dict[str, Any]:
    return wait_state(lab, command_id, *TERMINAL, timeout=timeout)


def assert_outcome(doc: dict[str, Any], state: str, reason: str | None = None) -> None:
    brief = {k: doc.get(k) for k in ("id", "kind", "state", "reason", "message", "attempt", "boot_id")}
    assert doc["state"] == state, f"expected {state}, got {brief}"
    if reason is not None:
        assert doc["reason"] == reason, f"expected {state} with reason {reason!r}, got {brief}"


def wait_reconnected(lab: Lab, node_id: str, after_epoch: int, timeout: float = 20.0) -> dict[str, Any]:
    """The node connected again, on a session newer than `after_epoch`."""

    def check() -> dict[str, Any] | None:
        doc = lab.show(node_id)
        return doc if doc["state"] == "connected" and doc["session_epoch"] > after_epoch else None

    return lab.wait_for(f"{node_id} connected on a session after epoch {after_epoch}", check, timeout=timeout)


def start_running(lab: Lab, kind: str, *args: str) -> dict[str, Any]:
    """Queue `kind` on n1 and wait until the node says it is running."""
    cmd = run(lab, "n1", kind, *args)
    wait_state(lab, cmd["id"], "running", timeout=15)
    return cmd


def refresh_succeeds(lab: Lab) -> dict[str, Any]:
    """A fresh `inventory.refresh` runs to `succeeded`: the node takes commands again, end to end."""
    doc = wait_settled(lab, run(lab, "n1", "inventory.refresh")["id"])
    assert_outcome(doc, "succeeded")
    return doc


# -- crash recovery --------------------------------------------------------------------


@pytest.mark.e2e
def test_gpu_reset_interrupted_by_kill_is_never_rerun(lab: Lab) -> None:
    lab.serve()
    lab.join("n1")
    lab.node("n1", env={"BC_FAKE_GPU_RESET_S": "30"})
    lab.wait_converged("n1")
    gpu = first_gpu(lab)
    before = lab.show("n1")

    cmd = start_running(lab, "gpu.reset", "--payload", json.dumps({"gpu_uuids": [gpu]}))
    lab.wait_for("the reset counted", lambda: resets(lab).get(gpu) == 1, timeout=5)
    lab.kill("node-n1")
    lab.node("n1")  # the next start resets GPUs at once: a re-run would finish, not hang

    doc = wait_settled(lab, cmd["id"])
    assert_outcome(doc, "failed", "interrupted")
    wait_reconnected(lab, "n1", before["session_epoch"])
    # Later than any redelivery: a second command goes through the same session and succeeds.
    refresh_succeeds(lab)
    refresh_succeeds(lab)

    assert resets(lab) == {gpu: 1}, f"the interrupted reset ran again: {resets(lab)}"
    accepted = log_lines(lab, cmd["id"], "command.accepted")
    assert len(accepted) == 1, "the interrupted gpu.reset was accepted again:\n" + "\n".join(accepted)
    assert_outcome(show(lab, cmd["id"]), "failed", "interrupted")
    assert_no_tracebacks(lab)


@pytest.mark.e2e
def test_retry_safe_refresh_reruns_after_kill(lab: Lab) -> None:
    lab.serve()
    lab.join("n1")
    lab.node("n1", env={"BC_FAKE_INVENTORY_REFRESH_S": "30"})
    lab.wait_converged("n1")

    cmd = start_running(lab, "inventory.refresh")
    lab.kill("node-n1")
    lab.node("n1")  # without the delay: the re-run finishes at once

    doc = wait_settled(lab, cmd["id"])
    assert_outcome(doc, "succeeded")
    assert doc["result"] and doc["result"].get("inventory", {}).get("gpus"), doc["result"]
    accepted = log_lines(lab, cmd["id"], "command.accepted")
    assert len(accepted) == 2, "expected the refresh accepted once per process:\n" + "\n".join(accepted)
    assert len(log_lines(lab, cmd["id"], "command.settled")) == 1
    assert_no_tracebacks(lab)


@pytest.mark.e2e
def test_fake_reboot_succeeds_from_the_next_boot(lab: Lab) -> None:
    before = bring_up(lab, {"n1": "hgx-h100-8"})["n1"]
    proc = lab.procs["node-n1"]
    old_boot = before["boot_id"]
    assert old_boot

    r = lab.run("cmd", "run", "n1", "node.reboot", "--wait", "--json", timeout=60)
    assert r.returncode == 0, f"node.reboot --wait exited {r.returncode}: {r.stderr.strip()!r}"
    doc = json.loads(r.stdout)
    assert_outcome(doc, "succeeded", "rebooted")

    after = wait_reconnected(lab, "n1", before["session_epoch"])
    assert after["boot_id"] and after["boot_id"] != old_boot, (old_boot, after["boot_id"])
    assert doc["boot_id"] == after["boot_id"], f"the result was not produced in the new boot: {doc}"
    fake_boot = (lab.node_dir("n1") / "fake-boot-id").read_text().strip()
    assert after["boot_id"] == fake_boot, (after["boot_id"], fake_boot)
    # The node's own `rebooted` result (journaled before the reboot, settled at the next start) names the boot it ended.
    assert isinstance(doc.get("result"), dict) and doc["result"].get("previous_boot_id") == old_boot, doc

    # The same process, re-executed in place, still runs and takes commands.
    assert lab.procs["node-n1"] is proc and proc.popen.poll() is None, "the node process exited"
    assert node_log(lab).count("event=agent.started") == 2, "the node did not start again in place"
    lab.wait_converged("n1")
    refresh_succeeds(lab)
    assert len(log_lines(lab, doc["id"], "command.accepted")) == 1, "node.reboot ran again after the reboot"
    assert_no_tracebacks(lab)


@pytest.mark.e2e
def test_duplicate_delivery_runs_once(lab: Lab) -> None:
    lab.serve()
    lab.join("n1")
    lab.node("n1", env={"BC_FAKE_GPU_RESET_S": "3"})
    before = lab.wait_converged("n1")
    gpu = first_gpu(lab)

    cmd = start_running(lab, "gpu.reset", "--payload", json.dumps({"gpu_uuids": [gpu]}))
    lab.kill("serve")
    lab.restart("serve")

    doc = wait_settled(lab, cmd["id"])
    assert_outcome(doc, "succeeded")
    wait_reconnected(lab, "n1", before["session_epoch"])
    refresh_succeeds(lab)
    assert resets(lab) == {gpu: 1}, f"the reset ran {resets(lab)} times"
    accepted = log_lines(lab, cmd["id"], "command.accepted")
    assert len(accepted) == 1, "the gpu.reset was accepted more than once:\n" + "\n".join(accepted)
    assert len(log_lines(lab, cmd["id"], "command.running")) == 1
    assert_no_tracebacks(lab)


# -- expiry ------------------------------------------------------------------------------


@pytest.mark.e2e
def test_not_after_passed_while_disconnected_expires(lab: Lab) -> None:
    before = bring_up(lab, {"n1": "hgx-h100-8"})["n1"]
    lab.kill("node-n1")
    lab.wait_for("n1 disconnected", lambda: lab.show("n1")["state"] == "disconnected", timeout=10)

    cmd = run(lab, "n1", "inventory.refresh", "--not-after", "2s")
    assert cmd["state"] == "pending", cmd
    # 2 s to pass not_after, then the sweeper (every 5 s) must notice.
    doc = wait_settled(lab, cmd["id"], timeout=15)
    assert_outcome(doc, "expired")

    lab.restart("node-n1")
    wait_reconnected(lab, "n1", before["session_epoch"])
    refresh_succeeds(lab)
    assert not [line for line in node_log(lab).splitlines() if f"command={cmd['id']}" in line], (
        "the node saw the expired command:\n" + node_log(lab)[-2000:]
    )
    assert_outcome(show(lab, cmd["id"]), "expired")
    assert_no_tracebacks(lab)


# -- lanes and credits -------------------------------------------------------------------


def lane_peaks(log: str, ids: set[str]) -> tuple[int, int, list[str]]:
    """Replay the node's log: the most commands of `ids` running at once, and accepted-but-unsettled at once.

    Also returns the order in which they were accepted.
    """
    running: set[str] = set()
    open_: set[str] = set()
    peak_running = peak_open = 0
    accepted: list[str] = []
    for line in log.splitlines():
        m = LOG_EVENT.search(line)
        if not m or m.group(2) not in ids:
            continue
        event, cid = m.groups()
        if event == "command.accepted":
            accepted.append(cid)
            open_.add(cid)
        elif event == "command.running":
            running.add(cid)
        elif event == "command.settled":
            running.discard(cid)
            open_.discard(cid)
        peak_running = max(peak_running, len(running))
        peak_open = max(peak_open, len(open_))
    return peak_running, peak_open, accepted


@pytest.mark.e2e
def test_burst_of_100_keeps_lane_order_and_credits(lab: Lab) -> None:
    lab.serve()
    lab.join("n1")
    # Queued while the node is away, so it arrives as one burst; each refresh takes a little while,
    # so the lane fills up: 4 workers, 8 credits.
    with ThreadPoolExecutor(4) as pool:
        cmds = list(pool.map(lambda _: run(lab, "n1", "inventory.refresh"), range(100)))
    seq = {c["id"]: int(c["seq"]) for c in cmds}
    assert len(set(seq.values())) == 100, "two commands got the same seq"
    assert {c["lane"] for c in cmds} == {"control"}, {c["lane"] for c in cmds}
    lab.node("n1", env={"BC_FAKE_INVENTORY_REFRESH_S": "0.05"})

    unsettled: list[tuple[str, int, str]] = []

    def all_settled() -> list[dict[str, Any]] | None:
        listed = [c for c in lab.bc("cmd", "list", "--node", "n1", "--limit", "1000") if c["id"] in seq]
        unsettled[:] = [(c["id"], c["seq"], c["state"]) for c in listed if c["state"] not in TERMINAL]
        return listed if len(listed) == 100 and not unsettled else None

    try:
        listed = lab.wait_for("all 100 commands settled", all_settled, timeout=30, interval=0.5)
    except WaitTimeout as e:
        seen = {
            cid: [line.split(" event=", 1)[-1] for line in node_log(lab).splitlines() if cid in line]
            for cid, _, _ in unsettled[:5]
        }
        raise WaitTimeout(
            f"{e}; {len(unsettled)} unsettled (id, seq, state): {unsettled[:10]}; what the node logged of them: {seen}"
            f"; session ends: {session_ends(lab)}"
        ) from None
    bad = [(c["id"], c["seq"], c["state"], c["reason"]) for c in listed if c["state"] != "succeeded"]
    assert not bad, f"{len(bad)} of 100 did not succeed: {bad[:10]}"

    peak_running, peak_open, accepted = lane_peaks(node_log(lab), set(seq))
    assert sorted(accepted) == sorted(seq), f"accepted {len(accepted)} lines for 100 commands"
    order = [seq[c] for c in accepted]
    swaps = [(a, b) for a, b in itertools.pairwise(order) if b < a]
    assert not swaps, f"accepted out of seq order at {swaps[:10]}: {order}"
    assert peak_running <= 4, f"{peak_running} commands ran at once on the control lane (4 workers)"
    assert peak_open <= 8, f"{peak_open} commands were accepted and unsettled at once (8 credits)"
    assert peak_running >= 2, f"the burst never ran two at once (peak {peak_running}): not a burst"
    # Nothing was killed: the whole burst went over the node's one session.
    assert not session_ends(lab), f"the node's session dropped during the burst: {session_ends(lab)}"
    assert_no_tracebacks(lab)


# -- journal loss --------------------------------------------------------------------------


@pytest.mark.e2e
def test_wiped_journal_fails_in_flight_with_journal_lost(lab: Lab) -> None:
    lab.serve()
    lab.join("n1")
    lab.node("n1", env={"BC_FAKE_GPU_RESET_S": "30"})
    before = lab.wait_converged("n1")
    gpu = first_gpu(lab)

    cmd = start_running(lab, "gpu.reset", "--payload", json.dumps({"gpu_uuids": [gpu]}))
    lab.kill("node-n1")
    wiped = sorted(p.name for p in lab.node_dir("n1").glob("journal.db*"))
    assert "journal.db" in wiped, wiped
    for p in lab.node_dir("n1").glob("journal.db*"):
        p.unlink()
    lab.node("n1")

    doc = wait_settled(lab, cmd["id"])
    assert_outcome(doc, "failed", "journal-lost")
    after = wait_reconnected(lab, "n1", before["session_epoch"])
    assert after["journal_id"] and after["journal_id"] != before["journal_id"], (
        before["journal_id"],
        after["journal_id"],
    )
    refresh_succeeds(lab)
    assert resets(lab) == {gpu: 1}, f"the reset ran again into the new journal: {resets(lab)}"
    assert len(log_lines(lab, cmd["id"], "command.accepted")) == 1
    assert_no_tracebacks(lab)


# -- bc cmd run --wait -------------------------------------------------------------------------


@pytest.mark.e2e
def test_cmd_wait_exit_codes(lab: Lab) -> None:
    bring_up(lab, {"n1": "hgx-h100-8"})

    ok = lab.run("cmd", "run", "n1", "inventory.refresh", "--wait")
    assert ok.returncode == 0, f"exited {ok.returncode}: {ok.stderr!r}"
    path = ok.stderr.strip().splitlines()
    assert path and "→" in path[-1] and path[-1].rstrip().endswith("succeeded"), (
        f"no state path ending in succeeded on stderr: {ok.stderr!r}"
    )
    assert "pending" in path[-1], ok.stderr

    bad = lab.run("cmd", "run", "n1", "gpu.reset", "--payload", '{"gpu_uuids":[]}', "--wait")
    errors = [line for line in bad.stderr.splitlines() if line.startswith("error:")]
    assert bad.returncode != 0, f"an empty gpu.reset exited 0: {bad.stdout!r}"
    assert len(errors) == 1 and "invalid-payload" in errors[0], f"stderr: {bad.stderr!r}"
    assert "Traceback" not in bad.stderr
    assert resets(lab) == {}, resets(lab)

    unknown = lab.run("cmd", "run", "n1", "no.such.kind")
    lines = unknown.stderr.splitlines()
    assert unknown.returncode == 2, f"exited {unknown.returncode}: {unknown.stderr!r}"
    assert len(lines) == 1 and lines[0].startswith("error:"), f"stderr: {unknown.stderr!r}"
    assert "no.such.kind" in lines[0], lines[0]
    assert not [c for c in lab.bc("cmd", "list", "--node", "n1") if c["kind"] == "no.such.kind"]
    assert_no_tracebacks(lab)
