"""Placement across two nodes of different shapes."""

from __future__ import annotations

import pytest

from .harness import Lab, assert_no_tracebacks, bring_up, cdi_env, cdi_problems, read_cdi


@pytest.mark.e2e
def test_two_nodes_placement(lab: Lab) -> None:
    bring_up(lab, {"n1": "hgx-h100-8", "n2": "mig-a100-4"})

    res = lab.bc("reserve", "--gpus", "1", "--class", "gpu.mig")
    assert res["node_id"] == "n2", f"a gpu.mig reservation landed on {res['node_id']!r}, not the MIG node: {res}"
    assert len(res["devices"]) == 1, res
    g = lab.show("n2")["generation"]
    lab.wait_converged("n2", g)

    cdi = lab.cdi_path("n2", res["allocation_id"])
    doc = lab.wait_for(f"the CDI spec {cdi.name}", lambda: read_cdi(cdi))
    assert not cdi_problems(doc), cdi_problems(doc)
    visible = cdi_env(doc).get("NVIDIA_VISIBLE_DEVICES", "")
    assert visible.startswith("MIG-") and "," not in visible, f"NVIDIA_VISIBLE_DEVICES={visible!r}"
    assert list(lab.cdi_dir("n1").glob("*.json")) == [], "n1 got a CDI spec for a MIG reservation"
    lab.wait_reservation_state(res["id"], "active")
    assert_no_tracebacks(lab)
