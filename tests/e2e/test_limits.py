"""The size limits end to end, with the installed `bc` only: the two regressions of issue 10, as written.

1. "One command cuts a node off for good": `bc cmd run n5 diag.nvml --payload @p.json`
   with 95,000 GPU UUIDs. Now the payload is refused at the door (exit 2, naming
   `max_payload_bytes`, nothing stored); a payload within the limit whose result is
   over `max_result_bytes` settles `failed` with `result-too-large` and the node's
   session never drops; and a ~10 MB result an older agent left in its journal is
   settled at start, so the restarted node reconnects at once.
2. "A failed `bc spec set` changes what is stored": two 3 MB sections. Now each is
   exit 2 naming `max_section_bytes`, the generation does not move, `bc spec show`
   works and the node stays converged; sections within their limit that together
   pass `max_spec_bytes` are refused the same way.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
from pathlib import Path
from typing import Any

import pytest

from .harness import Lab, assert_no_tracebacks, bring_up

MAX_PAYLOAD = "1,048,576 bytes (max_payload_bytes)"
MAX_SECTION = "262,144 bytes (max_section_bytes)"
MAX_SPEC = "1,048,576 bytes (max_spec_bytes)"


def gpu_uuids(n: int) -> list[str]:
    """`n` GPU UUIDs in the shape NVML uses, none of which the node has."""
    return [f"GPU-{i:08x}-1111-2222-3333-444444444444" for i in range(n)]


def one_line_refusal(r: subprocess.CompletedProcess[str], code: int, *needles: str) -> str:
    """The refusal's single `error:` line, after checking the exit code and that it names each needle."""
    lines = r.stderr.strip().splitlines()
    assert r.returncode == code, f"exit {r.returncode}, stderr {r.stderr[-600:]!r}"
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr[-600:]
    assert "Traceback" not in r.stderr + r.stdout
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def epoch(lab: Lab, node_id: str) -> int:
    return int(lab.show(node_id)["session_epoch"])


def session_ends(lab: Lab, node_id: str) -> list[str]:
    return [
        line
        for line in lab.log(f"node-{node_id}").splitlines()
        if "event=session.ended" in line or "event=session.closed" in line
    ]


# -- 1. one command must not cut a node off -------------------------------------------------------


@pytest.mark.e2e
def test_issue_10_one_command_cannot_cut_a_node_off(lab: Lab) -> None:
    bring_up(lab, {"n5": "hgx-h100-8"})
    first_epoch = epoch(lab, "n5")

    # Exactly as reported: 95,000 GPU UUIDs. Refused at the door, nothing stored.
    p = lab.root / "p.json"
    p.write_text(json.dumps({"gpu_uuids": gpu_uuids(95_000)}))
    r = lab.run("cmd", "run", "n5", "diag.nvml", "--payload", f"@{p}")
    line = one_line_refusal(r, 2, "the diag.nvml payload is ", MAX_PAYLOAD)
    assert f"{len(p.read_text().strip()):,} bytes" in line
    assert lab.bc("cmd", "list", "--node", "n5") == []

    # A payload within the limit whose result is not: the node settles it failed, and says why.
    q = lab.root / "q.json"
    q.write_text(json.dumps({"gpu_uuids": gpu_uuids(20_000)}))
    r = lab.run("cmd", "run", "n5", "diag.nvml", "--payload", f"@{q}", "--wait", "--json", timeout=60)
    assert r.returncode == 8, r.stderr[-600:]
    cmd = json.loads(r.stdout)
    assert (cmd["state"], cmd["reason"]) == ("failed", "result-too-large"), cmd
    assert "the limit is 1,048,576 bytes (max_result_bytes); the command itself ended succeeded" in cmd["message"]
    assert cmd["result"]["result_bytes"] > 1_048_576 and cmd["result"]["outcome"] == "succeeded"

    # The node was never cut off: same session, and the next command runs.
    assert lab.show("n5")["state"] == "connected" and epoch(lab, "n5") == first_epoch
    assert session_ends(lab, "n5") == []
    r = lab.run("cmd", "run", "n5", "inventory.refresh", "--wait", "--json", timeout=60)
    assert r.returncode == 0 and json.loads(r.stdout)["state"] == "succeeded", r.stderr[-600:]
    assert_no_tracebacks(lab)


# What an agent without the limits journaled: a terminal CommandUpdate with a ~10 MB result, encoded by hand
# (protobuf's wire format: field 1 command_id, 2 state, 5 result, 6 boot_id), as such an agent wrote it.
def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, data: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(data)) + data


def older_agents_update(command_id: str, result: bytes) -> bytes:
    succeeded = 3  # CommandState.COMMAND_SUCCEEDED
    return _field(1, command_id.encode()) + _varint(2 << 3) + _varint(succeeded) + _field(5, result)


@pytest.mark.e2e
def test_issue_10_an_oversized_result_an_older_agent_left_is_settled_at_start(lab: Lab) -> None:
    lab.serve()
    lab.join("n5")
    lab.node("n5", env={"BC_FAKE_INVENTORY_REFRESH_S": "60"})  # slow enough to be in flight when the node dies
    lab.wait_converged("n5")
    cid = lab.bc("cmd", "run", "n5", "inventory.refresh")["id"]
    lab.wait_for("the refresh to run", lambda: lab.bc("cmd", "show", cid)["state"] == "running", timeout=20)
    before = epoch(lab, "n5")
    lab.kill("node-n5")

    # The older agent finished it with a ~10 MB result and died before the ack: every Hello it sent was refused.
    result = json.dumps({g: {"error": "unknown GPU"} for g in gpu_uuids(150_000)}).encode()
    assert len(result) > 10_000_000
    with sqlite3.connect(lab.node_dir("n5") / "journal.db") as db:
        n = db.execute(
            "UPDATE commands SET state = 'done', result = ?, acked = 0 WHERE command_id = ?",
            (older_agents_update(cid, result), cid),
        ).rowcount
    assert n == 1

    lab.restart("node-n5")
    doc = lab.wait_for(
        "the command to settle", lambda: (d := lab.bc("cmd", "show", cid))["state"] in ("failed", "succeeded") and d
    )
    assert (doc["state"], doc["reason"]) == ("failed", "result-too-large"), doc
    assert f"the result is {len(result):,} bytes; the limit is 1,048,576 bytes (max_result_bytes)" in doc["message"]
    lab.wait_for("n5 connected again", lambda: lab.show("n5")["state"] == "connected" and epoch(lab, "n5") > before)
    assert f"event=journal.oversized-settled command={cid}" in lab.log("node-n5")
    assert "event=session.frame-refused" not in lab.log("node-n5")
    r = lab.run("cmd", "run", "n5", "diag.nvml", "--wait", "--json", timeout=60)
    assert r.returncode == 0 and json.loads(r.stdout)["state"] == "succeeded", r.stderr[-600:]
    assert_no_tracebacks(lab)


# -- 2. a failed spec set must change nothing -------------------------------------------------------


def host_section(target_bytes: int) -> dict[str, Any]:
    units = [
        {"name": f"u{i:05d}", "settings_json": json.dumps({"v": "x" * 900})} for i in range(max(1, target_bytes // 960))
    ]
    return {"units": units}


def access_section(target_bytes: int) -> dict[str, Any]:
    return {
        "ssh_ca_keys": [
            f"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAICgSvCEPeeLHJiWeXDoCuN5bdn6mpHrcxSLMYt/aGFcW {'c' * 920}ca{i}"
            for i in range(target_bytes // 1020)
        ]
    }


def telemetry_section(target_bytes: int) -> dict[str, Any]:
    return {"resource_attributes": {f"k{i:05d}": "v" * 1000 for i in range(target_bytes // 1015)}}


def site_section(target_bytes: int) -> dict[str, Any]:
    return {"cache_images": [{"url": f"https://img.example/{i}/{'p' * 1000}"} for i in range(target_bytes // 1040)]}


def instances_section(target_bytes: int) -> dict[str, Any]:
    one = {"runtime": "qemu", "vcpus": 1, "memory_mib": 256, "kernel": "k", "cmdline": "m" * 940}
    return {"instances": [{"id": f"i{i}", **one} for i in range(target_bytes // 1030)]}


def section_file(lab: Lab, name: str, doc: dict[str, Any]) -> Path:
    path = lab.root / f"{name}.json"
    path.write_text(json.dumps(doc))
    return path


@pytest.mark.e2e
def test_issue_10_a_failed_spec_set_changes_nothing(lab: Lab) -> None:
    bring_up(lab, {"n1": "hgx-h100-8"})
    before = lab.bc("spec", "show", "n1")
    first_epoch = epoch(lab, "n1")

    # Exactly as reported: two 3 MB sections. Each refused with the limit named; never exit 5.
    for name, doc in (("host", host_section(3_000_000)), ("access", access_section(3_000_000))):
        path = section_file(lab, name, doc)
        r = lab.run("spec", "set", "n1", name, f"@{path}")
        line = one_line_refusal(r, 2, f"the {name} section is ", MAX_SECTION)
        assert f"{len(path.read_text().strip()):,} bytes" in line
    assert lab.bc("spec", "show", "n1") == before
    lab.wait_converged("n1", before["generation"])
    assert epoch(lab, "n1") == first_epoch

    # Sections within their limit that together would pass max_spec_bytes: the last is refused, nothing moves.
    fills = [host_section, access_section, telemetry_section, site_section, instances_section]
    names = ["host", "access", "telemetry", "site", "instances"]
    for name, fill in zip(names[:4], fills[:4], strict=True):
        lab.bc("spec", "set", "n1", name, f"@{section_file(lab, name, fill(250_000))}")
    stored = lab.bc("spec", "show", "n1")
    assert stored["generation"] == before["generation"] + 4
    r = lab.run("spec", "set", "n1", "instances", f"@{section_file(lab, 'instances', fills[4](250_000))}")
    one_line_refusal(r, 2, "the spec of n1 would be ", MAX_SPEC)
    assert lab.bc("spec", "show", "n1") == stored
    # The node holds the ~1 MB spec it was sent, and never lost its session over any of this.
    lab.wait_converged("n1", stored["generation"], timeout=30)
    assert epoch(lab, "n1") == first_epoch
    assert_no_tracebacks(lab)
