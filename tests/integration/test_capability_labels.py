"""A real agent's Hello, through a real gateway: its capabilities become `bc.dev/cap.*` node labels."""

from __future__ import annotations

import json

from tests.integration.conftest import InprocLab


async def test_the_agents_capabilities_are_labels_on_its_node(lab: InprocLab) -> None:
    await lab.join("n1")
    await lab.admin.label_node("n1", {"pool": "a100"}, [])
    await lab.start_node("n1")
    await lab.wait_connected("n1")
    info = await lab.admin.get_node("n1")
    assert dict(info.labels) == {
        "bc.dev/cap.binding.kubernetes": "1",
        "bc.dev/cap.devices.cdi": "1",
        "bc.dev/cap.devices.limits": "1",
        "bc.dev/cap.instances.qemu": "1",  # its fake runtime (docs/instances.md)
        "bc.dev/cap.instance.volumes": "1",  # it keeps persistent volumes
        "bc.dev/cap.tunnel.offers": "1",  # it takes its tunnels' offers on its session stream
        "pool": "a100",
    }
    assert {"devices.limits", "binding.kubernetes"} <= set(info.capabilities)


async def test_a_kubernetes_reservation_binds_on_a_node_that_advertises_it(lab: InprocLab) -> None:
    await lab.join("n1")
    await lab.start_node("n1")
    await lab.wait_connected("n1")
    res = await lab.admin.reserve(1, node_id="n1", binding="kubernetes")
    await lab.wait_event("reservation.active", lambda ev, d: ev.subject == res.id)
    doc = json.loads((lab.node_dir("n1") / "cdi" / f"bc-{res.allocation_id}.json").read_text())
    assert doc["annotations"]["bc.dev/binding"] == "kubernetes"
    assert not any(line.startswith("NVIDIA_VISIBLE_DEVICES=") for line in doc["containerEdits"]["env"])
    assert "bc.dev/cgroup-parent" not in doc["annotations"]
