"""GPU health end to end (issue 17): faults injected into a fake node raise and clear conditions that
`bc nodes show --json` and the events log show; an unhealthy GPU takes no new hold while the hold on it
stays; `gpu.reset` clears the XID of a GPU that reads healthy after it, and keeps one that does not.

Faults come from `bc node --fake-fault` and the file `<data-dir>/fake-faults` the test writes
(agent/hw/fake_faults.py); the node reads health every 2 s, so every wait here is a few seconds.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from .harness import Lab, assert_no_tracebacks, bring_up


def conditions(doc: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c.get("status", ""), c.get("reason", "")) for c in doc.get("conditions", [])}


def gpus(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return list(doc["inventory"]["gpus"])


def write_faults(lab: Lab, node_id: str, *faults: str) -> None:
    path = lab.node_dir(node_id) / "fake-faults"
    tmp = path.with_name(".fake-faults.tmp")
    tmp.write_text("".join(f"{f}\n" for f in faults))
    tmp.replace(path)


def wait_conditions(lab: Lab, node_id: str, want: dict[str, tuple[str, str]], timeout: float = 20) -> dict[str, Any]:
    """Until `bc nodes show` has every condition of `want` with that (status, reason)."""
    last: list[dict[str, tuple[str, str]]] = [{}]

    def check() -> dict[str, Any] | None:
        doc = lab.show(node_id)
        have = conditions(doc)
        last[0] = {k: have.get(k, ("absent", "")) for k in want}
        return doc if all(have.get(k) == v for k, v in want.items()) else None

    try:
        return lab.wait_for(f"{node_id}'s conditions {want}", check, timeout)
    except AssertionError as e:
        raise AssertionError(f"{e}; had {last[0]}") from None


def gpu_cond(uuid: str) -> str:
    return f"GpuHealthy/{uuid}"


@pytest.mark.e2e
def test_each_injected_fault_raises_its_condition_and_clearing_it_clears_the_condition(lab: Lab) -> None:
    lab.serve()
    lab.join("n1")
    lab.node("n1", extra=("--fake-fault", "xid79:0"))
    doc = lab.wait_converged("n1")
    uuids = [g["uuid"] for g in gpus(doc)]
    healthy_all = {gpu_cond(u): ("True", "Healthy") for u in uuids[1:]}
    doc = wait_conditions(
        lab,
        "n1",
        {
            gpu_cond(uuids[0]): ("False", "Xid79"),
            **healthy_all,
            "NodeReady": ("True", "Ready"),
            "ClockSkew": ("False", "InSync"),
            "JournalFull": ("False", "HasRoom"),
            "HostResourcesExhausted": ("False", "HasRoom"),
        },
    )
    assert [g.get("healthy", False) for g in gpus(doc)] == [False] + [True] * 7
    assert f"GPU {uuids[0]} unhealthy" in doc["no_schedule"]
    (xid,) = [c for c in doc["conditions"] if c["type"] == gpu_cond(uuids[0])]
    assert "XID 79" in xid["message"] and int(xid.get("age_ms", 0)) >= 0

    faults = {
        uuids[1]: ("ecc", "EccUncorrectable"),
        uuids[2]: ("remap-pending", "RowRemapPending"),
        uuids[3]: ("remap-failed", "RowRemapFailed"),
        uuids[4]: ("throttle", "Throttled"),
        uuids[5]: ("offbus", "FallenOffBus"),
        uuids[6]: ("xid48", "Xid48"),
    }
    write_faults(lab, "n1", *(f"{kind}:{u}" for u, (kind, _) in faults.items()), "memory-low")
    doc = wait_conditions(
        lab,
        "n1",
        {
            **{gpu_cond(u): ("False", reason) for u, (_, reason) in faults.items()},
            gpu_cond(uuids[7]): ("True", "Healthy"),
            "HostResourcesExhausted": ("True", "MemoryLow"),
            "NodeReady": ("False", "HostResourcesExhausted"),
        },
    )
    assert [g.get("healthy", False) for g in gpus(doc)] == [False] * 7 + [True]

    write_faults(lab, "n1", "disk-low")
    wait_conditions(
        lab,
        "n1",
        {
            **{gpu_cond(u): ("True", "Healthy") for u in uuids[1:6]},
            gpu_cond(uuids[6]): ("False", "Xid48"),  # an XID holds for the boot, until a reset
            "HostResourcesExhausted": ("True", "DiskLow"),
        },
    )
    write_faults(lab, "n1")
    doc = wait_conditions(lab, "n1", {"HostResourcesExhausted": ("False", "HasRoom"), "NodeReady": ("True", "Ready")})

    # The events log tells the story, one event per change.
    story = [
        (e["data"]["type"], e["data"]["status"], e["data"]["reason"])
        for e in lab.events("node.condition")
        if e["subject"] == "n1"
    ]
    for u, (_, reason) in faults.items():
        assert (gpu_cond(u), "False", reason) in story, story
    for u in uuids[1:6]:
        assert story.count((gpu_cond(u), "True", "Healthy")) == 2, (u, story)  # first seen, then healed
    assert ("HostResourcesExhausted", "True", "MemoryLow") in story
    assert ("HostResourcesExhausted", "True", "DiskLow") in story
    assert story[-1] in (("HostResourcesExhausted", "False", "HasRoom"), ("NodeReady", "True", "Ready"))

    table = lab.bc("nodes", "show", "n1", json=False)
    assert "CONDITIONS" in table and "Xid79" in table and "Xid48" in table
    assert_no_tracebacks(lab)


@pytest.mark.e2e
def test_an_unhealthy_gpu_takes_no_new_hold_while_the_hold_on_it_stays(lab: Lab) -> None:
    bring_up(lab, {"n1": "hgx-h100-8"})
    held = lab.bc("reserve", "--gpus", "1", "--node", "n1")
    held = lab.wait_reservation_state(held["id"], "active")
    (device,) = held["devices"]
    bad = device["gpu_uuid"]
    other = next(g["uuid"] for g in gpus(lab.show("n1")) if g["uuid"] != bad)
    write_faults(lab, "n1", f"xid79:{bad}", f"ecc:{other}")
    doc = wait_conditions(
        lab, "n1", {gpu_cond(bad): ("False", "Xid79"), gpu_cond(other): ("False", "EccUncorrectable")}
    )
    assert {g["uuid"] for g in gpus(doc) if not g.get("healthy", False)} == {bad, other}

    # I5: the hold on the failing GPU stays, and so does its CDI spec on the node.
    assert lab.reservation(held["id"])["state"] == "active"  # type: ignore[index]
    assert lab.cdi_path("n1", held["allocation_id"]).exists()

    six = lab.bc("reserve", "--gpus", "6", "--node", "n1")
    six = lab.wait_reservation_state(six["id"], "active")
    assert not {d["gpu_uuid"] for d in six["devices"]} & {bad, other}
    one_more = lab.bc("reserve", "--gpus", "1", "--node", "n1")
    assert one_more["state"] == "pending", one_more
    assert lab.reservation(held["id"])["state"] == "active"  # type: ignore[index]
    assert_no_tracebacks(lab)


@pytest.mark.e2e
def test_gpu_reset_clears_the_xid_of_a_gpu_that_reads_healthy_and_keeps_one_that_does_not(lab: Lab) -> None:
    lab.serve()
    lab.join("n1")
    lab.node("n1", extra=("--fake-fault", "xid79:0", "--fake-fault", "xid94:1", "--fake-fault", "ecc:1"))
    doc = lab.wait_converged("n1")
    g0, g1 = (g["uuid"] for g in gpus(doc)[:2])
    wait_conditions(lab, "n1", {gpu_cond(g0): ("False", "Xid79"), gpu_cond(g1): ("False", "EccUncorrectable")})

    cmd = lab.bc("cmd", "run", "n1", "gpu.reset", "--payload", json.dumps({"gpu_uuids": [g0, g1]}))
    done = lab.wait_for(
        "the reset settled",
        lambda: (d := lab.bc("cmd", "show", cmd["id"]))["state"] in ("succeeded", "failed") and d,
        timeout=30,
    )
    assert done["state"] == "succeeded", done
    result = done["result"] if isinstance(done["result"], dict) else json.loads(done["result"])
    assert {e["uuid"]: e["healthy"] for e in result["gpus"]} == {g0: True, g1: False}

    doc = wait_conditions(lab, "n1", {gpu_cond(g0): ("True", "Healthy"), gpu_cond(g1): ("False", "EccUncorrectable")})
    assert [g.get("healthy", False) for g in gpus(doc)[:2]] == [True, False]
    write_faults(lab, "n1")  # nothing listed: the flag's ECC fault still holds, and the XID stays behind it
    (c1,) = [c for c in lab.show("n1")["conditions"] if c["type"] == gpu_cond(g1)]
    assert "XID 94" in c1["message"], c1
    assert_no_tracebacks(lab)
