"""A reservation's life on a node, and what survives a node or the server being killed."""

from __future__ import annotations

import signal
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from .harness import HEARTBEAT_S, Lab, always, assert_no_tracebacks, bring_up, cdi_env, cdi_problems, read_cdi


def reserve(lab: Lab, node_id: str, gpus: int) -> dict[str, Any]:
    res = lab.bc("reserve", "--gpus", str(gpus), "--node", node_id)
    assert isinstance(res, dict), res
    assert res.get("node_id") == node_id, res
    assert isinstance(res.get("id"), str) and res["id"], res
    assert isinstance(res.get("allocation_id"), str) and res["allocation_id"], res
    assert len(res.get("devices") or []) == gpus, res
    return res


def assert_valid_cdi(path: Path, res: dict[str, Any]) -> dict[str, Any]:
    doc = read_cdi(path)
    assert doc is not None, f"no CDI spec at {path}; dir has {sorted(p.name for p in path.parent.glob('*'))}"
    problems = cdi_problems(doc)
    assert not problems, f"{path} is not a valid CDI spec: {problems}\n{doc}"
    uuids = {d["gpu_uuid"] for d in res["devices"]}
    visible = set(filter(None, cdi_env(doc).get("NVIDIA_VISIBLE_DEVICES", "").split(",")))
    assert visible == uuids, f"NVIDIA_VISIBLE_DEVICES {visible} != the reservation's devices {uuids}"
    assert len(doc.get("devices") or []) == len(res["devices"]), doc
    return doc


@pytest.mark.e2e
def test_reserve_cdi_release(lab: Lab) -> None:
    before = bring_up(lab, {"n1": "hgx-h100-8"})["n1"]
    g0 = before["generation"]

    res = reserve(lab, "n1", 2)
    g1 = lab.show("n1")["generation"]
    assert g1 > g0, f"a reservation did not bump n1's generation ({g0} -> {g1})"
    if "generation" in res:
        assert res["generation"] == g1, res
    lab.wait_converged("n1", g1)

    cdi = lab.cdi_path("n1", res["allocation_id"])
    lab.wait_for(f"the CDI spec {cdi.name}", lambda: read_cdi(cdi))
    assert_valid_cdi(cdi, res)
    lab.wait_reservation_state(res["id"], "active")
    assert res["id"] in {r["id"] for r in lab.bc("reservations") if r.get("state") == "active"}

    lab.bc("release", res["id"], json=False)
    lab.wait_for(f"the CDI spec {cdi.name} removed", lambda: not cdi.exists())
    lab.wait_reservation_state(res["id"], "released")
    g2 = lab.show("n1")["generation"]
    assert g2 > g1, f"a release did not bump n1's generation ({g1} -> {g2})"
    lab.wait_converged("n1", g2)
    assert list(lab.cdi_dir("n1").glob("*.json")) == []
    assert_no_tracebacks(lab)


@pytest.mark.e2e
def test_node_killed_spec_changed_while_down(lab: Lab) -> None:
    bring_up(lab, {"n1": "hgx-h100-8"})

    lab.kill("node-n1")
    lab.wait_for(
        "n1 disconnected within 3 heartbeat intervals",
        lambda: lab.show("n1")["state"] == "disconnected",
        # the server must notice within 3 intervals; the rest is the CLI's own latency
        timeout=3 * HEARTBEAT_S + 1.5,
    )

    # Issue 13: a hold named for a node that is away waits, pending, and is placed once the node is back
    # (it was placed at once, to bind on reconnect).
    res = lab.bc("reserve", "--gpus", "1", "--node", "n1")
    assert (res["state"], res["reason"]) == ("pending", "node n1 is disconnected"), res
    endpoint = "http://127.0.0.1:4317"
    lab.bc("spec", "set", "n1", "telemetry", f'{{"otlp_endpoint":"{endpoint}"}}', json=False)
    spec = lab.bc("spec", "show", "n1")
    assert spec["spec"]["telemetry"] == {"otlp_endpoint": endpoint}, spec
    down = lab.show("n1")
    assert down["state"] == "disconnected", down
    g = down["generation"]
    assert spec["generation"] == g
    assert down["observed_generation"] < g, down

    cdi = lab.cdi_path("n1", res["allocation_id"])
    assert not cdi.exists(), "a CDI spec appeared while its node was down"

    lab.restart("node-n1")
    placed = lab.wait_for(
        "the waiting hold placed on n1 once it is back",
        lambda: (r := lab.reservation(res["id"])) is not None and r["state"] in ("placed", "active") and r,
    )
    assert placed["generation"] > g, placed
    doc = lab.wait_converged("n1", placed["generation"])
    assert_valid_cdi(cdi, placed)
    sections = {s["section"]: s for s in doc["sections"]}
    # The telemetry converger takes the section whether or not a collector listens (docs/telemetry.md).
    assert sections["telemetry"]["state"] == "CONVERGED", sections["telemetry"]
    assert sections["devices"]["state"] == "CONVERGED", sections["devices"]
    assert doc["observed_generation"] == doc["generation"] == placed["generation"]
    lab.wait_reservation_state(res["id"], "active")
    assert_no_tracebacks(lab)


@pytest.mark.e2e
def test_server_killed_and_restarted(lab: Lab) -> None:
    up = bring_up(lab, {"n1": "hgx-h100-8", "n2": "hgx-h100-8"})
    res = reserve(lab, "n1", 1)
    lab.wait_reservation_state(res["id"], "active")
    cdi = lab.cdi_path("n1", res["allocation_id"])
    assert_valid_cdi(cdi, res)
    before = {n: lab.wait_converged(n) for n in up}

    def reconnected(node_id: str) -> dict[str, Any] | None:
        doc = lab.show(node_id)
        ok = doc["state"] == "connected" and doc["session_epoch"] > before[node_id]["session_epoch"]
        return doc if ok else None

    with always(f"the CDI spec {cdi.name} exists", cdi.exists):
        lab.kill("serve")
        lab.restart("serve")
        after = {n: lab.wait_for(f"{n} reconnected with a new session epoch", partial(reconnected, n)) for n in up}
        for n in up:
            assert after[n]["generation"] == before[n]["generation"], (n, before[n], after[n])
            assert after[n]["observed_generation"] == after[n]["generation"], (n, after[n])
        kept = lab.reservation(res["id"])
        assert kept is not None and kept["state"] == "active", kept

        # The restarted server still places, delivers and converges.
        res2 = reserve(lab, "n2", 2)
        g = lab.show("n2")["generation"]
        assert g > before["n2"]["generation"]
        lab.wait_converged("n2", g)
        assert_valid_cdi(lab.cdi_path("n2", res2["allocation_id"]), res2)
        lab.wait_reservation_state(res2["id"], "active")
    assert_valid_cdi(cdi, res)
    assert_no_tracebacks(lab)


@pytest.mark.e2e
def test_serve_stops_cleanly_with_nodes_connected(lab: Lab) -> None:
    bring_up(lab, {"n1": "hgx-h100-8"})

    code = lab.kill("serve", signal.SIGTERM)
    log = lab.log("serve")
    assert code == 0, f"bc serve exited {code} on SIGTERM"
    assert "Traceback" not in log and "level=ERROR" not in log, "bc serve did not stop cleanly:\n" + log[-3000:]
    # The node rides it out: it keeps running and redials.
    assert lab.running("node-n1")
