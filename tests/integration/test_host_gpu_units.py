"""The GPU node host units through the real host converger, the fake runner and the fake hardware's models.

NVIDIA's driver and Fabric Manager packages, nvidia-container-toolkit and kubeadm are not installable on this
machine, so the fake runner hands their argv to the fake hardware's GPU host model (agent.hw.fake_gpu_host),
which keeps what they changed: the code above the runner is the production code. What an operator sees is
asserted: the commands the node ran, the files it wrote (parsed), the inventory's driver and the conditions.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from agent.converge.host import HostConverger
from agent.converge.host_ops import FakeRunner, HostOps
from agent.converge.run import CONVERGED, FAILED, SectionResult
from agent.converge.secret_port import SecretRefused, SecretUnavailable
from agent.health.rules import Verdict
from agent.hw import cdi
from agent.hw.fake import FakeHardware, InProcessReboot
from agent.hw.fake_host import seed_host_root
from bc.protocol.atoms import parse_atom
from bc.protocol.pb import spec_pb2

TOKEN = "abcdef.0123456789abcdef"
HASH = "sha256:" + "ab" * 32
FM = "nvidia-fabricmanager.service"
CHANGES = ("apt-get", "env", "apt-mark", "dnf", "modprobe", "systemctl", "kubeadm")


class Node:
    def __init__(self, tmp: Path, profile: str) -> None:
        self.root, self.cdi_dir = tmp / "root", tmp / "cdi"
        self.hw = FakeHardware(profile, "node-a", state_dir=tmp / "hw", reboot=InProcessReboot(hook=lambda: None))
        seed_host_root(self.root, self.hw.inventory(), self.hw.capabilities.nvswitches)
        self.runner = FakeRunner(tools=self.hw.capabilities.tools, log_file=tmp / "fake-host-commands.jsonl")
        self.labels: dict[str, str] = {}  # the node's bc labels, as its held spec body carries them
        self.converger = HostConverger(
            HostOps(self.root, run=self.runner), self.hw, cdi_dir=self.cdi_dir, node_labels=lambda: self.labels
        )

    async def converge(self, generation: int = 1, **units: object) -> SectionResult:
        section = spec_pb2.HostSection(
            units=[spec_pb2.HostUnit(name=n, settings_json=json.dumps(s)) for n, s in units.items()]
        )
        return await self.converger.converge(section, generation)

    def changes(self) -> list[list[str]]:
        """The commands that may change the host since the last call (queries left out)."""
        calls, self.runner.calls = self.runner.calls, []
        return [c for c in calls if c[0] in CHANGES and c[:2] != ["systemctl", "is-active"]]

    def conditions(self) -> dict[str, Verdict]:
        return {v.type: v for v in self.converger.verdicts}

    def hold(self, aid: str) -> None:
        uuid = self.hw.inventory().gpus[0].uuid
        dev = cdi.ResolvedDevice(parse_atom("gpu", uuid), uuid, 0)
        doc = cdi.render_spec(aid, "r1", [dev], cdi.env_lines(aid, [dev], kubernetes=False), kubernetes=False)
        cdi.atomic_write(cdi.spec_path(self.cdi_dir, aid), cdi.spec_bytes(doc))


async def test_a_driver_and_fabric_manager_install_wait_for_a_reboot_and_then_match(tmp_path: Path) -> None:
    node = Node(tmp_path, "hgx-h100-8")
    units = {"nvidia-driver": {"version": "550.127.05"}, "fabric-manager": {"version": "550.127.05"}}
    first = await node.converge(**units)
    assert first.state == CONVERGED, first.message
    assert node.changes() == [
        [
            "env",
            "DEBIAN_FRONTEND=noninteractive",
            "apt-get",
            "install",
            "-y",
            "-q",
            "--no-install-recommends",
            "--allow-downgrades",
            "--allow-change-held-packages",
            "nvidia-driver-550=550.127.05-*",
        ],
        ["apt-mark", "hold", "nvidia-driver-550"],
        [
            "env",
            "DEBIAN_FRONTEND=noninteractive",
            "apt-get",
            "install",
            "-y",
            "-q",
            "--no-install-recommends",
            "--allow-downgrades",
            "--allow-change-held-packages",
            "nvidia-fabricmanager-550=550.127.05-*",
        ],
        ["apt-mark", "hold", "nvidia-fabricmanager-550"],
        ["systemctl", "enable", FM],  # not started: Fabric Manager refuses a driver of another version
    ]
    assert node.hw.inventory().driver_version == "550.90.07"  # installed, not loaded: the node never reboots itself
    seen = node.conditions()
    assert (seen["DriverMismatch"].status, seen["DriverMismatch"].reason) == ("True", "RebootRequired")
    assert "driver 550.90.07 is loaded; the spec asks for 550.127.05" in seen["DriverMismatch"].message
    assert (seen["FabricManagerReady"].status, seen["FabricManagerReady"].reason) == ("False", "VersionMismatch")

    assert (await node.converge(2, **units)).state == CONVERGED
    assert node.changes() == []  # idempotent: only queries

    await node.hw.reboot(allow=True)  # what the reboot job does (bc jobs run reboot: Drain, then node.reboot)
    assert node.hw.inventory().driver_version == "550.127.05"
    assert (await node.converge(3, **units)).state == CONVERGED
    assert node.changes() == []  # Fabric Manager started at boot: it was enabled
    seen = node.conditions()
    assert (seen["DriverMismatch"].status, seen["DriverMismatch"].reason) == ("False", "Matches")
    assert (seen["FabricManagerReady"].status, seen["FabricManagerReady"].reason) == ("True", "Running")
    assert "4 NVSwitches" in seen["FabricManagerReady"].message

    gone = await node.converge(4)
    assert gone.state == CONVERGED
    assert node.changes() == [
        ["systemctl", "disable", "--now", FM],
        ["apt-mark", "unhold", "nvidia-fabricmanager-550"],
        ["apt-mark", "unhold", "nvidia-driver-550"],
    ]
    assert node.conditions() == {}  # the conditions left with their units
    assert node.hw.inventory().driver_version == "550.127.05"  # the driver stays


async def test_fabric_manager_is_not_needed_without_nvswitches_and_a_reload_waits_for_holds(tmp_path: Path) -> None:
    node = Node(tmp_path, "l4-slots-4")
    assert (await node.converge(**{"fabric-manager": {"branch": "550"}})).state == CONVERGED
    assert node.changes() == []
    assert node.conditions()["FabricManagerReady"].reason == "NotNeeded"

    node.hold("alloc-1")
    units = {"nvidia-driver": {"branch": "560", "activate": "reload"}}
    assert (await node.converge(2, **units)).state == CONVERGED
    assert [c[-1] for c in node.changes()] == ["nvidia-driver-560", "nvidia-driver-560"]  # install, hold
    seen = node.conditions()["DriverMismatch"]
    assert (seen.reason, node.hw.inventory().driver_version) == ("ReloadWaiting", "550.90.07")
    assert "once no GPU is held" in seen.message

    cdi.remove_file(cdi.spec_path(node.cdi_dir, "alloc-1"))  # the hold ends
    assert (await node.converge(3, **units)).state == CONVERGED
    assert node.changes() == [
        ["modprobe", "-r", "nvidia_drm", "nvidia_modeset", "nvidia_uvm", "nvidia"],
        ["modprobe", "-a", "nvidia", "nvidia_uvm", "nvidia_modeset", "nvidia_drm"],
    ]
    assert node.hw.inventory().driver_version == "560.35.03"
    assert node.conditions()["DriverMismatch"].reason == "Matches"


async def test_a_failed_install_raises_the_condition_and_retries(tmp_path: Path) -> None:
    node = Node(tmp_path, "hgx-h100-8")
    bad = await node.converge(**{"nvidia-driver": {"branch": "999"}})  # no such branch in the repositories
    assert (bad.state, bad.terminal) == (FAILED, False)
    assert "Unable to locate package nvidia-driver-999" in bad.message
    seen = node.conditions()["DriverMismatch"]
    assert (seen.status, seen.reason) == ("True", "InstallFailed")
    invalid = await node.converge(2, **{"nvidia-driver": {"version": "550"}})
    assert (invalid.state, invalid.terminal) == (FAILED, True)
    assert node.conditions()["DriverMismatch"].reason == "UnitInvalid"


OPERATOR_CONTAINERD = '# ours\nversion = 2\n[plugins."io.containerd.grpc.v1.cri".containerd]\nsnapshotter = "zfs"\n'
OPERATOR_DOCKER = '{"log-driver": "journald", "live-restore": true}'


async def test_the_container_toolkit_points_the_runtimes_at_bcs_cdi_dir_and_keeps_the_operators_settings(
    tmp_path: Path,
) -> None:
    node = Node(tmp_path, "hgx-h100-8")
    (node.root / "etc/containerd").mkdir(parents=True)
    (node.root / "etc/containerd/config.toml").write_text(OPERATOR_CONTAINERD)
    (node.root / "etc/docker").mkdir(parents=True)
    (node.root / "etc/docker/daemon.json").write_text(OPERATOR_DOCKER)
    units = {"container-toolkit": {"runtimes": ["containerd", "docker", "cri-o"]}}
    node.runner.fail_on.append(("systemctl", "restart", "docker.service"))
    failed = await node.converge(**units)
    assert (failed.state, failed.terminal) == (FAILED, False)
    assert node.conditions()["ContainerToolkitReady"].reason == "ApplyFailed"
    # whole or not at all: the runtimes it added are as the operator left them
    assert tomllib.loads((node.root / "etc/containerd/config.toml").read_text()) == tomllib.loads(OPERATOR_CONTAINERD)
    assert json.loads((node.root / "etc/docker/daemon.json").read_text()) == json.loads(OPERATOR_DOCKER)
    assert not (node.root / "etc/crio/crio.conf.d/99-bc-cdi.conf").exists()

    node.runner.fail_on.clear()
    node.changes()
    assert (await node.converge(2, **units)).state == CONVERGED
    dirs = [str(node.cdi_dir), "/etc/cdi", "/var/run/cdi"]
    containerd = tomllib.loads((node.root / "etc/containerd/config.toml").read_text())
    cri = containerd["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["enable_cdi"] is True and cri["cdi_spec_dirs"] == dirs
    assert cri["containerd"]["snapshotter"] == "zfs"
    docker = json.loads((node.root / "etc/docker/daemon.json").read_text())
    assert docker["features"]["cdi"] is True and docker["cdi-spec-dirs"] == dirs
    assert docker["log-driver"] == "journald" and docker["live-restore"] is True
    crio = tomllib.loads((node.root / "etc/crio/crio.conf.d/99-bc-cdi.conf").read_text())
    assert crio["crio"]["runtime"]["cdi_spec_dirs"] == dirs
    toolkit = tomllib.loads((node.root / "etc/nvidia-container-runtime/config.toml").read_text())
    assert toolkit["nvidia-container-runtime"]["mode"] == "cdi"
    restarts = [c[2] for c in node.changes() if c[:2] == ["systemctl", "restart"]]
    assert restarts == ["containerd.service", "docker.service", "crio.service"]
    assert node.conditions()["ContainerToolkitReady"].status == "True"

    docker["debug"] = True  # the operator's own edit, in their own layout: theirs, no restart
    (node.root / "etc/docker/daemon.json").write_text(json.dumps(docker))
    assert (await node.converge(3, **units)).state == CONVERGED
    assert node.changes() == []

    assert (await node.converge(4)).state == CONVERGED
    assert tomllib.loads((node.root / "etc/containerd/config.toml").read_text()) == tomllib.loads(OPERATOR_CONTAINERD)
    assert json.loads((node.root / "etc/docker/daemon.json").read_text()) == {
        **json.loads(OPERATOR_DOCKER),
        "debug": True,
    }
    assert not (node.root / "etc/crio/crio.conf.d/99-bc-cdi.conf").exists()
    assert not (node.root / "etc/nvidia-container-runtime/config.toml").exists()
    assert [c[-1] for c in node.changes()] == [
        "containerd.service",
        "docker.service",
        "crio.service",
        "nvidia-container-toolkit",
    ]


JOIN = {"api_server": "10.0.0.1:6443", "token": TOKEN, "ca_cert_hashes": [HASH], "labels": {"bc.dev/pool": "a"}}


async def test_a_kubernetes_join_keeps_its_token_out_of_every_record_log_and_message(tmp_path: Path) -> None:
    node = Node(tmp_path, "hgx-h100-8")
    node.runner.fail_on.append(("kubeadm", "join"))
    failed = await node.converge(kubernetes=JOIN)
    assert (failed.state, failed.terminal) == (FAILED, False)
    assert node.conditions()["KubernetesJoined"].reason == "JoinFailed"
    assert not (node.root / "etc/kubernetes/bc-join.yaml").exists()  # removed whatever the join did

    node.runner.fail_on.clear()
    assert (await node.converge(2, kubernetes=JOIN)).state == CONVERGED
    assert node.changes()[-1] == ["kubeadm", "join", "--config", str(node.root / "etc/kubernetes/bc-join.yaml")]
    assert (node.root / "etc/kubernetes/kubelet.conf").exists()
    assert not (node.root / "etc/kubernetes/bc-join.yaml").exists()
    seen = node.conditions()["KubernetesJoined"]
    assert (seen.status, seen.reason, seen.message) == ("True", "Joined", "joined to 10.0.0.1:6443")
    assert (await node.converge(3, kubernetes={**JOIN, "token": "zzzzzz.zzzzzzzzzzzzzzzz"})).state == CONVERGED
    assert node.changes() == []  # a new token changes nothing on a joined node

    everything = [failed.message, *(v.message for v in node.converger.verdicts)]
    everything += [p.read_text() for p in tmp_path.rglob("*") if p.is_file() and p.suffix in (".json", ".jsonl")]
    assert not [t for t in everything if "0123456789abcdef" in t]

    assert (await node.converge(4)).state == CONVERGED
    assert node.changes() == [["kubeadm", "reset", "--force"]]
    assert not (node.root / "etc/kubernetes/kubelet.conf").exists()


async def test_the_join_registers_the_nodes_bc_labels_that_kubernetes_accepts_as_they_are_at_the_join(
    tmp_path: Path,
) -> None:
    node = Node(tmp_path, "hgx-h100-8")
    node.labels = {"bc.dev/pool": "b", "rack": "r1", "node-role.kubernetes.io/gpu": "", "team": "ml"}
    node.runner.fail_on.append(("kubeadm", "join"))
    await node.converge(kubernetes=JOIN)  # the first join fails: nothing registered yet
    said = node.conditions()["KubernetesJoined"]
    assert said.reason == "JoinFailed" and said.message.endswith("; bc labels left out: node-role.kubernetes.io/gpu")

    node.labels = {**node.labels, "rack": "r2"}  # relabelled meanwhile: the next join takes the labels of now
    node.runner.fail_on.clear()
    assert (await node.converge(2, kubernetes=JOIN)).state == CONVERGED
    kubelet = (node.root / "etc/kubernetes/kubelet.conf").read_text()
    # the unit's own setting wins on a shared key (bc.dev/pool=a); the kubelet may not set node-role.kubernetes.io
    assert '# node-labels: "bc.dev/pool=a,rack=r2,team=ml"' in kubelet, kubelet
    seen = node.conditions()["KubernetesJoined"]
    assert seen.message == "joined to 10.0.0.1:6443; bc labels left out: node-role.kubernetes.io/gpu"

    assert node.changes()[-1][:2] == ["kubeadm", "join"]
    node.labels = {"rack": "r3"}
    assert (await node.converge(3, kubernetes=JOIN)).state == CONVERGED
    assert node.changes() == []  # a joined node is not joined again: kubeadm does not relabel (docs/host.md)


@pytest.mark.parametrize("os_release", ['ID="rocky"\nID_LIKE="rhel centos fedora"\n'])
async def test_a_dnf_host_installs_with_dnf(tmp_path: Path, os_release: str) -> None:
    node = Node(tmp_path, "hgx-h100-8")
    (node.root / "etc/os-release").write_text(os_release)
    assert (await node.converge(**{"nvidia-driver": {"version": "550.127.05"}})).state == CONVERGED
    assert node.changes() == [["dnf", "install", "-y", "-q", "nvidia-driver-550.127.05"]]
    assert node.conditions()["DriverMismatch"].reason == "RebootRequired"


class Broker:
    """The secret port as a converger sees it (agent.converge.secret_port): a value, no answer, or a refusal."""

    def __init__(self) -> None:
        self.value: bytes | Exception = SecretUnavailable("no session to ask the broker on")
        self.asked: list[tuple[str, str, int, str]] = []

    async def get(self, name: str, section: str, generation: int, unit: str = "", allocation_id: str = "") -> bytes:
        self.asked.append((name, section, generation, unit))
        if isinstance(self.value, Exception):
            raise self.value
        return self.value

    def release(self, section: str, unit: str = "") -> None:
        pass


async def test_a_kubernetes_join_by_secret_reference_waits_for_the_broker(tmp_path: Path) -> None:
    node = Node(tmp_path, "hgx-h100-8")
    broker = Broker()
    node.converger.ctx.secrets = broker
    by_ref = {"api_server": "10.0.0.1:6443", "token_secret_ref": "k8s-join", "ca_cert_hashes": [HASH]}

    waiting = await node.converge(3, kubernetes=by_ref)  # no answer: retried, never failed for good
    assert (waiting.state, waiting.terminal) == (FAILED, False) and "no session" in waiting.message
    assert node.conditions()["KubernetesJoined"].reason == "JoinFailed"
    assert broker.asked == [("k8s-join", "host", 3, "kubernetes")]

    broker.value = SecretRefused("out-of-scope", "the secret's scope does not admit node node-a")
    refused = await node.converge(3, kubernetes=by_ref)
    assert (refused.state, refused.terminal) == (FAILED, False) and "out-of-scope" in refused.message

    broker.value = b"not-a-token\n"
    bad = await node.converge(3, kubernetes=by_ref)
    assert "is not a bootstrap token" in bad.message and "not-a-token" not in bad.message

    broker.value = (TOKEN + "\n").encode()
    assert (await node.converge(3, kubernetes=by_ref)).state == CONVERGED
    assert node.changes()[-1][:2] == ["kubeadm", "join"]
    assert (node.root / "etc/kubernetes/kubelet.conf").exists()
    asked = len(broker.asked)
    assert (await node.converge(4, kubernetes=by_ref)).state == CONVERGED
    assert len(broker.asked) == asked  # a joined node never asks again
    records = [p.read_text() for p in tmp_path.rglob("*") if p.is_file() and p.suffix in (".json", ".jsonl")]
    assert not [t for t in records if "0123456789abcdef" in t]


@pytest.mark.parametrize(
    "settings",
    [
        {"api_server": "10.0.0.1:6443", "ca_cert_hashes": [HASH]},
        {"api_server": "10.0.0.1:6443", "token": TOKEN, "token_secret_ref": "k", "ca_cert_hashes": [HASH]},
        {"api_server": "10.0.0.1:6443", "token_secret_ref": "Bad Name", "ca_cert_hashes": [HASH]},
    ],
)
async def test_the_token_is_the_spec_s_or_a_secret_s_never_both(tmp_path: Path, settings: dict[str, object]) -> None:
    node = Node(tmp_path, "hgx-h100-8")
    result = await node.converge(kubernetes=settings)
    assert (result.state, result.terminal, result.reason) == (FAILED, True, "UnitInvalid")
