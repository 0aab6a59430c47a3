"""The node screen's INSTANCES block: bc's VMs with their desired state, foreign domains, and escaping."""

from __future__ import annotations

from bc.protocol.pb import admin_pb2, common_pb2
from tui.screens.node import render_node


def test_the_node_screen_lists_instances_and_escapes_what_the_node_says() -> None:
    info = admin_pb2.NodeInfo(node_id="n1", role="node", state="connected")
    info.instances.add(id="web-1", state="RUNNING", desired="RUNNING", managed=True, vcpus=4, memory_mib=8192)
    info.instances.add(
        id="big", state="STOPPED", desired="RUNNING", managed=True, vcpus=1, memory_mib=4096,
        message="ResourcesExhausted: 4480 MiB needed, 2688 MiB left",
    )  # fmt: skip
    info.instances.add(id="evil\x1b[2J\nFAKE LINE", state="RUNNING", managed=False)
    text = render_node(info, [], [], []).plain
    block = text.split("INSTANCES\n", 1)[1].split("CAPACITY", 1)[0].splitlines()
    assert block[0].split() == ["web-1", "running", "want", "running", "4", "vCPU", "8192", "MiB"]
    assert block[1].split()[:4] == ["big", "stopped", "want", "running"]
    assert block[1].endswith("ResourcesExhausted: 4480 MiB needed, 2688 MiB left")
    assert "\x1b" not in text and len(block) == 3 and "not bc's" in block[2] and "FAKE LINE" in block[2]
    gpus = admin_pb2.NodeInfo(node_id="n1")
    gpus.instances.add(id="g", state="RUNNING", desired="RUNNING", managed=True, vcpus=2, memory_mib=1024)
    gpus.instances[0].gpus.extend(["GPU-a", "GPU-b"])
    row = render_node(gpus, [], [], []).plain.split("INSTANCES\n", 1)[1].splitlines()[0]
    assert row.split() == ["g", "running", "want", "running", "2", "vCPU", "1024", "MiB", "2", "GPUs"]
    assert "INSTANCES\n  none reported\n" in render_node(admin_pb2.NodeInfo(node_id="n2"), [], [], []).plain


def test_the_node_screen_shows_the_volume_store_the_node_reported() -> None:
    info = admin_pb2.NodeInfo(node_id="n1")
    info.instances.add(id="db", state="RUNNING", desired="RUNNING", managed=True, vcpus=1, memory_mib=512)
    gib = 1 << 30
    info.volume_storage.CopyFrom(
        common_pb2.VolumeStorage(
            total_bytes=100 * gib, available_bytes=60 * gib, reserved_bytes=5 * gib,
            committed_bytes=30 * gib, outstanding_bytes=12 * gib,
        )
    )  # fmt: skip
    block = render_node(info, [], [], []).plain.split("INSTANCES\n", 1)[1].split("CAPACITY", 1)[0].splitlines()
    assert block[-1] == (
        "  volumes: 30.0 GiB promised (12.0 GiB of it not yet written) on 100.0 GiB, 60.0 GiB available,"
        " 5.0 GiB kept in reserve"
    )
    assert "volumes:" not in render_node(admin_pb2.NodeInfo(node_id="n2"), [], [], []).plain  # none reported: none
