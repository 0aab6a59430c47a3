"""The device nodes a real host's CDI specs name: control nodes by stat, MIG caps from /proc (a tree in tmp)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from agent.hw.dev_nodes import DevNode, FakeDeviceNodes, HostDeviceNodes, node_facts, read_minor
from agent.hw.fake import FakeHardware


def proc_tree(proc: Path) -> None:
    proc.mkdir(parents=True)
    (proc / "devices").write_text("Character devices:\n  1 mem\n195 nvidia-frontend\n508 nvidia-caps\n511 nvidia-uvm\n")
    gi = proc / "driver/nvidia/capabilities/gpu0/mig/gi2"
    (gi / "ci0").mkdir(parents=True)
    (gi / "access").write_text("DeviceFileMinor: 21\nDeviceFileMode: 292\nDeviceFileModify: 1\n")
    (gi / "ci0" / "access").write_text("DeviceFileMinor: 22\nDeviceFileMode: 292\n")


def test_mig_caps_come_from_the_capability_access_files(tmp_path: Path) -> None:
    proc_tree(tmp_path / "proc")
    nodes = HostDeviceNodes(dev=tmp_path / "dev", proc=tmp_path / "proc")
    assert nodes.mig_caps(0, 2, 0) == [
        DevNode("/dev/nvidia-caps/nvidia-cap21", 508, 21),
        DevNode("/dev/nvidia-caps/nvidia-cap22", 508, 22),
    ]
    assert nodes.mig_caps(0, 5, 0) == []  # no such instance: nothing named
    assert read_minor(tmp_path / "nope") is None


def test_without_nvidia_caps_no_cap_node_is_named(tmp_path: Path) -> None:
    proc_tree(tmp_path / "proc")
    (tmp_path / "proc/devices").write_text("Character devices:\n195 nvidia-frontend\n")
    assert HostDeviceNodes(dev=tmp_path / "dev", proc=tmp_path / "proc").mig_caps(0, 2, 0) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="mknod needs root")
def test_control_nodes_are_the_character_devices_present(tmp_path: Path) -> None:
    dev = tmp_path / "dev"
    dev.mkdir()
    os.mknod(dev / "nvidiactl", 0o666 | stat.S_IFCHR, os.makedev(195, 255))
    os.mknod(dev / "nvidia-uvm", 0o666 | stat.S_IFCHR, os.makedev(511, 0))
    os.mknod(dev / "nvidia0", 0o666 | stat.S_IFCHR, os.makedev(195, 0))
    (dev / "nvidia-modeset").write_text("not a device")  # a plain file is not a node
    nodes = HostDeviceNodes(dev=dev, proc=tmp_path / "proc")
    assert nodes.control() == [DevNode("/dev/nvidiactl", 195, 255), DevNode("/dev/nvidia-uvm", 511, 0)]
    assert nodes.gpu(0) == DevNode("/dev/nvidia0", 195, 0) and nodes.gpu(1) is None


def test_the_fake_names_every_node_and_distinct_caps() -> None:
    inv = FakeHardware("mig-a100-4", "n").inventory()
    facts = node_facts(FakeDeviceNodes(), inv)
    assert [n.path for n in facts.control] == [
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
        "/dev/nvidia-modeset",
    ]
    assert sorted(facts.gpus) == [0, 1, 2, 3]
    caps = [n for nodes in facts.mig_caps.values() for n in nodes]
    assert len(facts.mig_caps) == 6 and all(len(v) == 2 for v in facts.mig_caps.values())
    gi_nodes = {v[0] for v in facts.mig_caps.values()}
    ci_nodes = {v[1] for v in facts.mig_caps.values()}
    assert not gi_nodes & ci_nodes and len(ci_nodes) == 6 and len({n.minor for n in caps}) == 12
