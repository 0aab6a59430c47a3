"""An unprivileged `bc node` beside a root `bc helper`, as an operator runs them: a real `bc serve`, the node
joined, a user made for it, the helper as root and the node as that user (`setpriv`), both the installed
`bc`. A reservation's hold lands through the helper as root's CDI file and its slice, the node's own `bc doctor` passes
`privileges` and `helper`, a stopped helper leaves the node connected and its devices section waiting (the
hold kept), and a started one lets the release through.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.harness import HEARTBEAT_S, Lab, assert_no_tracebacks, read_cdi
from tests.system_user import as_user, system_user, traversable_dir, why_not

pytestmark = pytest.mark.skipif(why_not() is not None, reason=why_not() or "")


@pytest.fixture
def uid() -> Iterator[int]:
    with system_user("bce") as u:
        yield u.uid


@pytest.fixture
def box() -> Iterator[Path]:
    """The node's and the helper's directories, in a temp dir the node's user can traverse."""
    with traversable_dir("bc-node-helper-") as d:
        yield d


def chown_tree(path: Path, uid: int) -> None:
    for p in [path, *path.rglob("*")]:
        os.chown(p, uid, uid, follow_symlinks=False)


def test_an_unprivileged_node_holds_through_the_helper_and_waits_for_it(uid: int, box: Path, lab: Lab) -> None:
    # uid and box first: they are torn down after the lab has stopped every process of the user
    sock, root, node_dir = box / "run" / "helper.sock", box / "root", box / "node-n1"
    root.mkdir(mode=0o755)
    lab.serve()
    lab.bc("join", "--server", lab.address, "--token", lab.token("n1"), "--data-dir", str(node_dir))
    chown_tree(node_dir, uid)
    helper_args = ("helper", "--socket", str(sock), "--allow-uid", str(uid), "--root", str(root))
    lab.spawn("helper", *helper_args, "--fake-commands", str(box / "commands.jsonl"))
    lab.wait_for("the helper's socket", sock.exists)
    node_argv = ["node", "--data-dir", str(node_dir), "--fake-hw", "hgx-h100-8"]
    node_argv += ["--heartbeat-interval", str(HEARTBEAT_S), "--helper-socket", str(sock)]
    lab._start("node-n1", as_user(uid, lab.bc_path, *node_argv), None, {"HOME": str(node_dir)})
    lab.wait_converged("n1")
    assert Path(f"/proc/{lab.procs['node-n1'].popen.pid}").stat().st_uid == uid  # the agent is not root

    res = lab.bc("reserve", "--gpus", "1", "--node", "n1", "--cpus", "2", "--memory", "4G")
    lab.wait_reservation_state(res["id"], "active")
    cdi = root / "etc" / "cdi" / f"bc-{res['allocation_id']}.json"
    doc = lab.wait_for(f"the CDI spec {cdi.name}", lambda: read_cdi(cdi))
    assert doc["annotations"]["bc.dev/allocation-id"] == res["allocation_id"]
    assert cdi.stat().st_uid == 0  # written by root: the node's user cannot write /etc/cdi
    slice_ = f"bc-alloc-{res['allocation_id']}.slice"
    assert doc["annotations"]["bc.dev/cgroup-parent"] == slice_
    ran = [json.loads(line) for line in (box / "commands.jsonl").read_text().splitlines()]
    assert ["systemctl", "start", slice_] in ran  # the slice, made by the helper (recorded: --fake-commands)

    doctor = subprocess.run(
        as_user(uid, lab.bc_path, "doctor", "--data-dir", str(node_dir), "--helper-socket", str(sock)),
        env={**lab.env, "HOME": str(node_dir)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    statuses = {
        line.split()[1]: line.split()[0] for line in doctor.stdout.splitlines()[:-1] if line[:4] in "passwarnfail"
    }
    assert (statuses.get("privileges"), statuses.get("helper")) == ("pass", "pass"), doctor.stdout

    lab.kill("helper", sig=15)
    lab.bc("release", res["id"])
    lab.wait_for(
        "the devices section to wait for the helper",
        lambda: any(
            s["section"] == "devices" and "helper: cannot reach" in s.get("message", "")
            for s in lab.show("n1").get("sections", [])
        ),
        timeout=30,
    )
    assert cdi.exists()  # nothing released while the helper is away
    assert lab.running("node-n1")

    lab.restart("helper")
    lab.wait_for("the hold's release through the helper", lambda: not cdi.exists(), timeout=30)
    assert_no_tracebacks(lab)
