"""The agent's convergers on the helper-backed seams, with a real helper on a unix socket in the test's directory.

Same uid here (the real-user test is tests/integration/test_helper_privsep.py): this shows the same converger
code binds, refreshes and releases holds and applies host units through `bc helper`, and that a helper that is
down leaves the section PROGRESSING-retryable with nothing released.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from agent.converge.devices import DevicesConverger
from agent.converge.host_ops import FakeRunner
from agent.converge.run import CONVERGED, FAILED
from agent.helper.client import HelperClient
from agent.helper.node_ops import HelperHardware
from agent.helper.ops import Layout
from agent.helper.server import HelperServer
from agent.helper.wiring import helper_seams
from agent.hw.fake import FakeHardware
from agent.hw.fake_host import seed_host_root
from agent.offload import to_thread
from bc.protocol.pb import session_pb2, spec_pb2


@dataclass
class Rig:
    tmp: Path
    layout: Layout
    runner: FakeRunner
    hw: FakeHardware
    server: object


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    layout, runner = Layout(tmp_path / "root"), FakeRunner()
    server = await HelperServer(layout, os.getuid(), run=runner).start(tmp_path / "helper.sock")
    async with server:
        yield Rig(tmp_path, layout, runner, FakeHardware("hgx-h100-8", "node-a"), server)
    server.close()
    await server.wait_closed()


def hold(aid: str, uuid: str, **limits: object) -> spec_pb2.DevicesSection:
    a = spec_pb2.DeviceAssignment(
        allocation_id=aid,
        reservation_id=f"res-{aid}",
        binding=spec_pb2.BINDING_HOLD,
        devices=[spec_pb2.DeviceRef(device_class="gpu", atom_id=uuid)],
        limits=spec_pb2.ResourceLimits(**limits),  # type: ignore[arg-type]
    )
    return spec_pb2.DevicesSection(assignments=[a])


async def test_a_hold_binds_and_releases_through_the_helper_and_waits_while_it_is_down(rig: Rig) -> None:
    seams = await helper_seams(rig.tmp / "helper.sock", rig.hw, rig.tmp / "data", root=Path("/"), offload=to_thread)
    assert seams.layout == rig.layout  # the helper named its own directories
    devices = DevicesConverger(
        seams.layout.cdi_dir, seams.layout.env_dir, rig.hw, "node-a", slices=seams.slices, files=seams.files
    )
    uuid = rig.hw.inventory().gpus[0].uuid
    aid = "alloc-3f9a0c1b2d4e"  # as the control plane names them (bc.seams.ids.short_id)
    result = await devices.converge(hold(aid, uuid, cpus="0-3", memory_bytes=1 << 30), 1)
    assert result.state == CONVERGED, result.message
    doc = json.loads((rig.layout.cdi_dir / f"bc-{aid}.json").read_text())
    assert doc["annotations"]["bc.dev/cgroup-parent"] == f"bc-alloc-{aid}.slice"
    assert (rig.layout.env_dir / f"bc-{aid}.env").read_text().startswith(f"# written by bc node for allocation {aid}")
    assert rig.runner.calls[1] == ["systemctl", "start", f"bc-alloc-{aid}.slice"]

    rig.server.close()  # type: ignore[attr-defined]
    await rig.server.wait_closed()  # type: ignore[attr-defined]
    down = await devices.converge(spec_pb2.DevicesSection(), 2)
    assert (down.state, down.terminal) == (FAILED, False)
    assert down.message.startswith(f"{aid}: helper: cannot reach")
    assert not [e for e in down.events if e.kind == session_pb2.AllocationReport.RELEASED]
    assert (rig.layout.cdi_dir / f"bc-{aid}.json").exists()  # nothing released while the helper is away


async def test_host_units_apply_through_the_helper_and_a_root_equivalent_sysctl_is_refused(rig: Rig) -> None:
    seams = await helper_seams(rig.tmp / "helper.sock", rig.hw, rig.tmp / "data", root=Path("/"), offload=to_thread)
    units = [spec_pb2.HostUnit(name="sysctl", settings_json=json.dumps({"vm.swappiness": 10}))]
    result = await seams.host.converge(spec_pb2.HostSection(units=units), 1)
    assert result.state == CONVERGED, result.message
    assert (rig.layout.root / "etc/sysctl.d/90-bc-sysctl.conf").read_text().endswith("vm.swappiness = 10\n")
    assert rig.runner.calls == [["sysctl", "-p", str(rig.layout.root / "etc/sysctl.d/90-bc-sysctl.conf")]]
    assert (rig.tmp / "data/host-state/etc/bc/host-units/sysctl.json").is_file()  # the record is the agent's

    units = [spec_pb2.HostUnit(name="sysctl", settings_json=json.dumps({"kernel.modprobe": "/tmp/x"}))]
    refused = await seams.host.converge(spec_pb2.HostSection(units=units), 2)
    assert (refused.state, refused.terminal) == (FAILED, False)
    assert "helper: refused: host.file.write" in refused.message
    assert "kernel.modprobe" not in (rig.layout.root / "etc/sysctl.d/90-bc-sysctl.conf").read_text()


async def test_a_gpu_reset_goes_to_the_helper_and_is_refused_when_not_allowed(rig: Rig) -> None:
    hw = HelperHardware(rig.hw, HelperClient(rig.tmp / "helper.sock"))
    uuid = rig.hw.inventory().gpus[0].uuid
    assert (await hw.reset_gpu(uuid, allow=False))[0] is False
    assert await hw.reset_gpu(uuid, allow=True) == (True, "reset")
    assert rig.runner.calls == [["nvidia-smi", "--gpu-reset", "-i", uuid]]


TOKEN = "abcdef.0123456789abcdef"
CA_HASH = "sha256:" + "ab" * 32
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAICgSvCEPeeLHJiWeXDoCuN5bdn6mpHrcxSLMYt/aGFcW"


@pytest.mark.skipif(
    shutil.which("ssh-keygen") is None, reason="ssh-keygen builds the KRL (apt-get install openssh-client)"
)
async def test_the_access_section_lands_in_the_helpers_ssh_dir_checked_and_reloaded_there(rig: Rig) -> None:
    seams = await helper_seams(
        rig.tmp / "helper.sock", rig.hw, rig.tmp / "data", root=Path("/"), offload=to_thread, node_id="node-a"
    )
    section = spec_pb2.AccessSection(ssh_ca_keys=[KEY], principals=["oncall@node-a"], revoked_serials=["7"])
    result = await seams.access.converge(section, 1)
    assert result.state == CONVERGED, result.message
    ssh = rig.layout.ssh_dir
    assert (ssh / "ca.pub").read_text().endswith(KEY + "\n")
    assert (ssh / "principals/oncall").read_text().endswith("oncall@node-a\n")
    assert (ssh / "revoked.krl").read_bytes().startswith(b"SSHKRL")
    sshd_config = str(rig.layout.root / "etc/ssh/sshd_config")
    assert rig.runner.calls == [
        ["sshd", "-t", "-f", sshd_config],
        ["sshd", "-t", "-f", sshd_config],
        ["systemctl", "reload", "ssh"],
    ]
    assert not (ssh / ".reload-owed").exists() and not (rig.tmp / "data/access/.reload-owed").exists()

    rig.runner.fail_on.append(("systemctl", "reload"))
    gone = await seams.access.converge(spec_pb2.AccessSection(), 2)
    assert (gone.state, gone.terminal) == (FAILED, False)
    assert gone.message.startswith("helper: sshd.reload failed: systemctl reload ssh exited 1")
    assert not (ssh / "ca.pub").exists()
    assert (rig.tmp / "data/access/.reload-owed").exists()  # the debt is the agent's, in its data dir


async def test_gpu_node_units_install_configure_and_join_through_the_helper(tmp_path: Path) -> None:
    """The driver, the container runtimes' CDI and a Kubernetes join as typed helper operations: the helper
    builds the argv and paths, merges into its own files, and joins only a cluster root listed."""
    hw = FakeHardware("hgx-h100-8", "node-a", state_dir=tmp_path / "hw")
    layout, runner = Layout(tmp_path / "root"), FakeRunner(tools=hw.capabilities.tools)
    seed_host_root(layout.root, hw.inventory(), hw.capabilities.nvswitches)
    (layout.root / "etc/docker").mkdir(parents=True)
    (layout.root / "etc/docker/daemon.json").write_text('{"log-driver": "journald"}')
    server = await HelperServer(layout, os.getuid(), run=runner).start(tmp_path / "helper.sock")
    async with server:
        seams = await helper_seams(tmp_path / "helper.sock", hw, tmp_path / "data", root=Path("/"), offload=to_thread)
        join = {"api_server": "10.0.0.1:6443", "token": TOKEN, "ca_cert_hashes": [CA_HASH]}
        units = {
            "nvidia-driver": {"version": "550.127.05"},
            "container-toolkit": {"runtimes": ["docker"]},
            "kubernetes": join,
        }
        section = spec_pb2.HostSection(
            units=[spec_pb2.HostUnit(name=n, settings_json=json.dumps(s)) for n, s in units.items()]
        )
        refused = await seams.host.converge(section, 1)
        assert (refused.state, refused.terminal) == (FAILED, False)
        assert "is not in" in refused.message and "kubernetes-clusters" in refused.message
        assert "0123456789abcdef" not in refused.message
        assert hw.gpu_host.installed["nvidia-driver-550"] == "550.127.05"  # the other units still converged
        docker = json.loads((layout.root / "etc/docker/daemon.json").read_text())
        assert docker["cdi-spec-dirs"][0] == str(layout.cdi_dir) and docker["log-driver"] == "journald"
        assert ["systemctl", "restart", "docker.service"] in runner.calls

        layout.kube_clusters.parent.mkdir(parents=True, exist_ok=True)
        layout.kube_clusters.write_text(f"# root's list\n10.0.0.1:6443 {CA_HASH}\n")
        joined = await seams.host.converge(section, 2)
        assert joined.state == CONVERGED, joined.message
        assert (layout.root / "etc/kubernetes/kubelet.conf").exists()
        assert not (layout.root / "etc/kubernetes/bc-join.yaml").exists()
        assert ["kubeadm", "join", "--config", str(layout.root / "etc/kubernetes/bc-join.yaml")] in runner.calls
        conditions = {v.type: v.reason for v in seams.host.verdicts}
        assert conditions == {
            "DriverMismatch": "RebootRequired",
            "ContainerToolkitReady": "Configured",
            "KubernetesJoined": "Joined",
        }
        record = (tmp_path / "data/host-state/etc/bc/host-units/kubernetes.json").read_text()
        assert "0123456789abcdef" not in record
    server.close()
    await server.wait_closed()
