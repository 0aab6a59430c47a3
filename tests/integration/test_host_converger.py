"""The host converger against a temp root and the fake runner: drop-ins written, idempotent, removed with their
unit, bad input refused whole, failed effects rolled back; nothing changes outside the root."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from agent.converge.host import ExternallyManaged, HostConverger, record_path
from agent.converge.host_ops import FakeRunner, HostOps, PathOutsideRoot
from agent.converge.host_units.gpu_sharing import MPS_UNIT_FILE, PLUGIN_CONFIG
from agent.converge.run import CONVERGED, FAILED, PROGRESSING, UNSUPPORTED, SectionResult
from agent.hw.fake import FakeHardware
from agent.hw.fake_host import seed_host_root
from bc.protocol.pb import spec_pb2

REAL_DIRS = [Path(p) for p in ("/etc/sysctl.d", "/etc/modules-load.d", "/etc/systemd/system", "/etc/bc")]
SYSCTL = "etc/sysctl.d/90-bc-sysctl.conf"
MODULES = "etc/modules-load.d/bc-kernel-modules.conf"
HP_1G_NODE0 = "sys/devices/system/node/node0/hugepages/hugepages-1048576kB/nr_hugepages"
HP_2M = "sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages"


def tree(path: Path) -> dict[str, str]:
    """Every file under `path` with a hash of its content (and every directory)."""
    out: dict[str, str] = {}
    if not path.exists():
        return out
    for p in sorted(path.rglob("*")):
        rel = str(p.relative_to(path))
        out[rel] = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() and not p.is_symlink() else "dir"
    return out


class Host:
    def __init__(self, tmp: Path, profile: str = "mig-a100-4") -> None:
        self.tmp = tmp
        self.root = tmp / "root"
        self.hw = FakeHardware(profile, "node-a")
        seed_host_root(self.root, self.hw.inventory())
        self.runner = FakeRunner(tools={"nvidia-smi": self.hw.mig.handle})
        self.ops = HostOps(self.root, run=self.runner)
        self.converger = HostConverger(self.ops, self.hw, cdi_dir=tmp / "cdi")
        self.outside = {p: tree(p) for p in [*REAL_DIRS, tmp]}

    async def converge(self, *units: tuple[str, object], generation: int = 1) -> SectionResult:
        section = spec_pb2.HostSection(units=[spec_pb2.HostUnit(name=n, settings_json=json.dumps(s)) for n, s in units])
        return await self.converger.converge(section, generation)

    def read(self, rel: str) -> str:
        return (self.root / rel).read_text()

    def exists(self, rel: str) -> bool:
        return (self.root / rel).exists()

    def commands(self) -> list[list[str]]:
        calls, self.runner.calls = self.runner.calls, []
        return calls

    def assert_nothing_outside_changed(self) -> None:
        for p, before in self.outside.items():
            after = tree(p)
            if p == self.tmp:
                before = {k: v for k, v in before.items() if not k.startswith("root")}
                after = {k: v for k, v in after.items() if not k.startswith("root")}
            assert after == before, f"{p} changed"


@pytest.fixture
def host(tmp_path: Path) -> Host:
    return Host(tmp_path)


SYSCTLS = {"vm.max_map_count": 262144, "net.core.somaxconn": "4096"}


async def test_units_write_drop_ins_are_idempotent_and_go_with_their_unit(host: Host) -> None:
    units = [
        ("sysctl", SYSCTLS),
        ("kernel-modules", {"modules": ["vfio_pci", "nvidia_peermem"]}),
        ("hugepages", {"pages": [{"size": "1G", "count": 16, "numa_node": 0}, {"size": "2M", "count": 512}]}),
    ]
    first = await host.converge(*units)
    assert first.state == CONVERGED, first.message
    assert host.read(SYSCTL).splitlines()[1:] == ["net.core.somaxconn = 4096", "vm.max_map_count = 262144"]
    assert host.read(MODULES).splitlines()[1:] == ["vfio_pci", "nvidia_peermem"]
    assert host.read(HP_1G_NODE0).strip() == "16" and host.read(HP_2M).strip() == "512"
    assert host.commands() == [
        ["sysctl", "-p", str(host.root / SYSCTL)],
        ["modprobe", "vfio_pci"],
        ["modprobe", "nvidia_peermem"],
    ]
    snapshot = tree(host.root)

    second = await host.converge(*units, generation=2)
    assert second.state == CONVERGED
    assert host.commands() == [] and tree(host.root) == snapshot  # nothing done twice

    (host.root / SYSCTL).unlink()  # drift: a drop-in deleted by hand comes back
    (host.root / HP_2M).write_text("0\n")
    assert (await host.converge(*units, generation=2)).state == CONVERGED
    assert host.exists(SYSCTL) and host.read(HP_2M).strip() == "512"
    assert host.commands() == [["sysctl", "-p", str(host.root / SYSCTL)]]

    gone = await host.converge(generation=3)
    assert gone.state == CONVERGED
    assert not host.exists(SYSCTL) and not host.exists(MODULES)
    assert host.read(HP_1G_NODE0).strip() == "64" and host.read(HP_2M).strip() == "0"  # the values before bc
    assert host.commands() == [["sysctl", "--system"]]
    assert not any((host.root / "etc/bc/host-units").iterdir())
    host.assert_nothing_outside_changed()


@pytest.mark.parametrize(
    ("unit", "settings", "why"),
    [
        ("sysctl", {"net/ipv4/ip_forward": 1}, "has a '/' or '..'"),
        ("sysctl", {"kernel..x": 1}, "has a '/' or '..'"),
        ("sysctl", {"vm.swappiness": "10\nkernel.panic = 0"}, "U+000A"),
        ("sysctl", {"vm.swappiness": "10 # x"}, "'#'"),
        ("hugepages", {"pages": [{"size": "3M", "count": 2}]}, "does not support 3072 kB huge pages"),
        ("hugepages", {"pages": [{"size": "1G", "count": 2, "numa_node": 7}]}, "no NUMA node 7"),
        ("kernel-modules", {"modules": ["../evil"]}, "is not a module name"),
        ("mig", {"gpus": [{"gpu": 2, "instances": ["5g.50gb"]}]}, "does not offer MIG profile '5g.50gb'"),
        ("mig", {"gpus": [{"gpu": 2, "instances": ["4g.40gb", "4g.40gb"]}]}, "needs 8 compute"),
        ("mig", {"gpus": [{"gpu": 9, "instances": []}]}, "no GPU 9"),
        ("gpu-sharing", {"mode": "mps", "replicas": 4}, "not a setting of mode mps"),
    ],
)
async def test_bad_input_fails_the_section_and_the_other_units_still_converge(
    host: Host, unit: str, settings: object, why: str
) -> None:
    good = ("kernel-modules", {"modules": ["vfio_pci"]}) if unit != "kernel-modules" else ("sysctl", SYSCTLS)
    before = tree(host.root)
    result = await host.converge((unit, settings), good)
    assert result.state == FAILED and result.terminal and result.reason == "UnitInvalid"
    assert why in result.message and result.message.startswith(f"{unit}:"), result.message
    assert not host.exists(record_path(unit))
    changed = {k for k, v in tree(host.root).items() if v != "dir" and before.get(k) != v}
    assert changed and all("bc-kernel-modules" in k or "90-bc-sysctl" in k or "host-units" in k for k in changed)
    assert host.exists(record_path(good[0]))
    host.assert_nothing_outside_changed()


async def test_a_failed_command_rolls_the_unit_back_and_the_next_pass_retries(host: Host) -> None:
    await host.converge(("kernel-modules", {"modules": ["vfio_pci"]}))
    old = host.read(MODULES)
    host.runner.fail_on = [("modprobe", "nvidia_peermem")]
    failed = await host.converge(("kernel-modules", {"modules": ["vfio_pci", "nvidia_peermem"]}), generation=2)
    assert failed.reported_state == PROGRESSING and failed.reason == "UnitApplyFailed"
    assert "modprobe nvidia_peermem exited 1" in failed.message
    assert host.read(MODULES) == old  # the old list back: applied whole or not at all

    host.runner.fail_on = []
    again = await host.converge(("kernel-modules", {"modules": ["vfio_pci", "nvidia_peermem"]}), generation=2)
    assert again.state == CONVERGED and host.read(MODULES).splitlines()[1:] == ["vfio_pci", "nvidia_peermem"]


async def test_a_pool_the_kernel_cannot_fill_goes_back_to_its_old_value(host: Host) -> None:
    class Stingy(HostOps):
        async def write_sysfs(self, rel: str, text: str) -> None:
            await super().write_sysfs(rel, "8" if text == "16" else text)  # asked for 16, the kernel gives 8

    host.converger.ops = host.converger.ctx.ops = Stingy(host.root, run=host.runner)
    pages = {"pages": [{"size": "2M", "count": 4}, {"size": "1G", "count": 16, "numa_node": 0}]}
    result = await host.converge(("hugepages", pages))
    assert result.reported_state == PROGRESSING and "the kernel gave 8" in result.message
    assert host.read(HP_2M).strip() == "0" and host.read(HP_1G_NODE0).strip() == "64"
    assert not host.exists(record_path("hugepages"))


async def test_without_a_spec_nothing_applied_is_undone(host: Host) -> None:
    await host.converge(("sysctl", SYSCTLS), ("gpu-sharing", {"mode": "mps"}))
    host.commands()
    snapshot = tree(host.root)
    kept = await host.converge(generation=0)  # a lost journal: the empty spec at generation 0
    assert kept.reported_state == PROGRESSING and kept.reason == "JournalLost"
    assert "(gpu-sharing, sysctl)" in kept.message
    assert tree(host.root) == snapshot and host.commands() == []
    assert (await host.converge(generation=1)).state == CONVERGED  # a signed spec without them removes them
    assert not host.exists(SYSCTL) and not host.exists(MPS_UNIT_FILE)


async def test_an_unknown_unit_is_unsupported_with_its_name(host: Host) -> None:
    result = await host.converge(("chrony", {}), ("sysctl", SYSCTLS))
    assert result.state == UNSUPPORTED and result.terminal and result.reason == "UnitUnsupported"
    assert "'chrony'" in result.message
    assert host.exists(SYSCTL)  # the units it knows still apply


async def test_gpu_sharing_applied_switched_and_removed(host: Host) -> None:
    mps = await host.converge(("gpu-sharing", {"mode": "mps", "active_thread_percentage": 25}))
    assert mps.state == CONVERGED, mps.message
    unit = host.read(MPS_UNIT_FILE)
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25" in unit and "RuntimeDirectory=nvidia-mps" in unit
    assert host.commands() == [
        ["systemctl", "daemon-reload"],
        ["systemctl", "enable", "bc-nvidia-mps.service"],
        ["systemctl", "restart", "bc-nvidia-mps.service"],
    ]
    assert (await host.converge(("gpu-sharing", {"mode": "mps", "active_thread_percentage": 25}))).state == CONVERGED
    assert host.commands() == []

    ts = await host.converge(("gpu-sharing", {"mode": "time-slicing", "replicas": 4}), generation=2)
    assert ts.state == CONVERGED
    assert not host.exists(MPS_UNIT_FILE) and "replicas: 4" in host.read(PLUGIN_CONFIG)
    assert host.commands() == [
        ["systemctl", "disable", "--now", "bc-nvidia-mps.service"],
        ["systemctl", "daemon-reload"],
        ["nvidia-smi", "-c", "DEFAULT"],
    ]

    await host.converge(("gpu-sharing", {"mode": "mps"}), generation=3)
    host.commands()
    removed = await host.converge(generation=4)
    assert removed.state == CONVERGED
    assert not host.exists(MPS_UNIT_FILE) and not host.exists(PLUGIN_CONFIG)
    assert host.commands() == [
        ["systemctl", "disable", "--now", "bc-nvidia-mps.service"],
        ["systemctl", "daemon-reload"],
        ["nvidia-smi", "-c", "DEFAULT"],
    ]
    host.assert_nothing_outside_changed()


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze on this machine")
async def test_systemd_accepts_the_mps_unit(host: Host, tmp_path: Path) -> None:
    await host.converge(("gpu-sharing", {"mode": "mps", "active_thread_percentage": 50}))
    unit = tmp_path / "bc-nvidia-mps.service"
    # The tools it runs are not on this machine: point them at ones that are, and judge the rest as written.
    text = host.read(MPS_UNIT_FILE).replace("/usr/bin/nvidia-smi", "/bin/true")
    unit.write_text(text.replace("/usr/bin/nvidia-cuda-mps-control", "/bin/true"))
    r = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
    problems = [line for line in r.stderr.splitlines() if "bc-nvidia-mps" in line]
    assert r.returncode == 0 and not problems, r.stderr


async def test_no_host_units_answers_host_managed_externally() -> None:
    ext = ExternallyManaged()
    assert (await ext.converge(spec_pb2.HostSection(), 1)).state == CONVERGED
    r = await ext.converge(spec_pb2.HostSection(units=[spec_pb2.HostUnit(name="sysctl", settings_json="{}")]), 1)
    assert r.state == UNSUPPORTED and r.terminal and r.reason == "HostManagedExternally"


@pytest.mark.parametrize("rel", ["../x", "/etc/passwd", "a/../../b", "", "a//b"])
def test_host_ops_refuses_paths_outside_the_root(tmp_path: Path, rel: str) -> None:
    with pytest.raises(PathOutsideRoot):
        HostOps(tmp_path).path(rel)
