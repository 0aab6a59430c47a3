"""A real agent's Hello, through a real gateway: its capabilities become `bc.dev/cap.*` node labels."""

from __future__ import annotations

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
        "pool": "a100",
    }
    assert {"devices.limits", "binding.kubernetes"} <= set(info.capabilities)
