"""The MIG layout on the fake hardware, a `gpu.mig` hold on the new instance, and its CDI spec judged the way a
CDI-only runtime would use it: the CDI schema, then resolve and inject it into a tmpfs /dev with mknod."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft7Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT7

from agent.converge.devices import DevicesConverger
from agent.converge.host import HostConverger
from agent.converge.host_ops import FakeRunner, HostOps
from agent.converge.run import CONVERGED, PROGRESSING
from agent.hw import cdi
from agent.hw.dev_nodes import DevNode, FakeDeviceNodes
from agent.hw.fake import FakeHardware
from bc.protocol.pb import session_pb2, spec_pb2

BUNDLED = Path(cdi.__file__).parent / "cdi_schema"
CONTROL = ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset"]


def shared_schema() -> Path:
    """The shared CDI schema (/work/shared/cdi-schema, found from any worktree), else the bundled copy."""
    for parent in Path(__file__).resolve().parents:
        for candidate in (parent / "shared" / "cdi-schema", parent / "work" / "shared" / "cdi-schema"):
            if (candidate / "schema.json").is_file():
                return candidate
    return BUNDLED


def assert_schema_accepts(doc: dict[str, Any]) -> None:
    folder = shared_schema()
    schema = json.loads((folder / "schema.json").read_text())
    defs = json.loads((folder / "defs.json").read_text())
    registry: Registry[Any] = Registry().with_resource(
        "defs.json", Resource.from_contents(defs, default_specification=DRAFT7)
    )
    errors = list(Draft7Validator(schema, registry=registry).iter_errors(doc))
    assert not errors, [e.message for e in errors]


class Node:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.state = tmp / "state"
        self.hw = FakeHardware("mig-a100-4", "node-m", state_dir=self.state)
        self.runner = FakeRunner(tools={"nvidia-smi": self.hw.mig.handle})
        self.cdi_dir = tmp / "cdi"
        self.host = HostConverger(HostOps(tmp / "root", run=self.runner), self.hw, cdi_dir=self.cdi_dir)
        self.devices = DevicesConverger(
            self.cdi_dir, tmp / "env", self.hw, "node-m", mps_pipe_dir=tmp / "mps", dev_nodes=FakeDeviceNodes()
        )

    async def layout(self, gpus: list[dict[str, Any]], generation: int = 1) -> Any:
        unit = spec_pb2.HostUnit(name="mig", settings_json=json.dumps({"gpus": gpus}))
        return await self.host.converge(spec_pb2.HostSection(units=[unit]), generation)

    async def hold(self, *atoms: str, generation: int = 1) -> Any:
        a = [
            spec_pb2.DeviceAssignment(
                allocation_id=f"m{i}",
                reservation_id=f"r{i}",
                binding=spec_pb2.BINDING_HOLD,
                devices=[spec_pb2.DeviceRef(device_class="gpu.mig", atom_id=atom)],
            )
            for i, atom in enumerate(atoms)
        ]
        return await self.devices.converge(spec_pb2.DevicesSection(assignments=a), generation)


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return Node(tmp_path)


async def test_a_layout_made_on_the_fake_takes_a_mig_hold_on_its_new_instance(node: Node) -> None:
    gpu2 = node.hw.inventory().gpus[2]
    assert not gpu2.mig_enabled and not gpu2.mig_instances
    missing = await node.hold(f"{gpu2.uuid}/1/0")  # before the layout: device-missing
    assert missing.state != CONVERGED and "no MIG instance gi=1 ci=0" in missing.message

    result = await node.layout([{"gpu": 2, "instances": ["3g.40gb", "2g.20gb", "2g.20gb"]}])
    assert result.state == CONVERGED, result.message
    assert node.runner.calls == [
        ["nvidia-smi", "-i", "2", "-mig", "1"],
        ["nvidia-smi", "mig", "-i", "2", "-dci"],
        ["nvidia-smi", "mig", "-i", "2", "-dgi"],
        ["nvidia-smi", "mig", "-i", "2", "-cgi", "3g.40gb,2g.20gb,2g.20gb", "-C"],
    ]
    inv = node.hw.inventory()
    gpu2 = inv.gpus[2]
    assert gpu2.mig_enabled
    assert [(m.gi, m.ci, m.profile) for m in gpu2.mig_instances] == [
        (1, 0, "3g.40gb"),
        (2, 0, "2g.20gb"),
        (3, 0, "2g.20gb"),
    ]
    assert all(m.uuid.startswith("MIG-") for m in gpu2.mig_instances)
    assert [g.mig_instances[0].profile for g in inv.gpus[:2]] == ["3g.40gb", "3g.40gb"]  # the others untouched

    node.runner.calls.clear()
    assert (await node.layout([{"gpu": 2, "instances": ["2g.20gb", "3g.40gb", "2g.20gb"]}])).state == CONVERGED
    assert node.runner.calls == []  # the same profiles in another order: nothing to do

    bound = await node.hold(f"{gpu2.uuid}/2/0", generation=2)
    assert bound.state == CONVERGED, bound.message
    assert [e.kind for e in bound.events] == [session_pb2.AllocationReport.BOUND]
    doc = json.loads((node.cdi_dir / "bc-m0.json").read_text())
    assert_schema_accepts(doc)
    cdi.validate_spec(doc)
    assert doc["containerEdits"]["env"][0] == f"NVIDIA_VISIBLE_DEVICES={gpu2.mig_instances[1].uuid}"
    assert [n["path"] for n in doc["containerEdits"]["deviceNodes"]] == CONTROL
    [device] = doc["devices"]
    paths = [n["path"] for n in device["containerEdits"]["deviceNodes"]]
    assert paths[0] == "/dev/nvidia2"
    caps = paths[1:]
    assert len(caps) == 2 and all(p.startswith("/dev/nvidia-caps/nvidia-cap") for p in caps), paths

    # A fake agent restart keeps the layout (the fake keeps it in its state dir, as a GPU keeps its own).
    again = FakeHardware("mig-a100-4", "node-m", state_dir=node.state)
    assert again.inventory().gpus[2] == gpu2


async def test_a_layout_never_changes_under_a_hold(node: Node) -> None:
    gpu0 = node.hw.inventory().gpus[0]
    assert (await node.hold(f"{gpu0.uuid}/1/0")).state == CONVERGED
    busy = await node.layout([{"gpu": 0, "instances": ["7g.80gb"]}])
    assert busy.reported_state == PROGRESSING and "GPU 0 has holds" in busy.message
    assert node.runner.calls == [] and node.hw.inventory().gpus[0] == gpu0

    assert (await node.devices.converge(spec_pb2.DevicesSection(), 2)).state == CONVERGED  # released
    done = await node.layout([{"gpu": 0, "instances": ["7g.80gb"]}], generation=2)
    assert done.state == CONVERGED, done.message
    assert [m.profile for m in node.hw.inventory().gpus[0].mig_instances] == ["7g.80gb"]


async def test_a_layout_the_tool_refuses_puts_the_old_one_back(node: Node) -> None:
    before = node.hw.inventory().gpus[1]
    node.runner.fail_on = [("nvidia-smi", "mig", "-i", "1", "-cgi", "1g.10gb,1g.10gb")]
    failed = await node.layout([{"gpu": 1, "instances": ["1g.10gb", "1g.10gb"]}])
    assert failed.reported_state == PROGRESSING and "-cgi 1g.10gb,1g.10gb -C exited 1" in failed.message
    after = node.hw.inventory().gpus[1]
    assert [m.profile for m in after.mig_instances] == [m.profile for m in before.mig_instances]


async def test_mig_mode_off(node: Node) -> None:
    result = await node.layout([{"gpu": "GPU-" + node.hw.inventory().gpus[0].uuid[4:], "enabled": False}])
    assert result.state == CONVERGED, result.message
    gpu0 = node.hw.inventory().gpus[0]
    assert not gpu0.mig_enabled and not gpu0.mig_instances


# -- the runtime's view --------------------------------------------------------------------------------


def resolve_cdi(cdi_dir: Path, qualified: str) -> dict[str, Any]:
    """What a CDI runtime does with `--device bc.dev/gpu=<name>`: find the device in the specs of its kind,
    and merge the spec's containerEdits with the device's (env and deviceNodes, spec level first)."""
    kind, _, name = qualified.partition("=")
    for path in sorted(cdi_dir.glob("*.json")):
        doc = json.loads(path.read_text())
        if doc.get("kind") != kind:
            continue
        for d in doc["devices"]:
            if d["name"] == name:
                edits: dict[str, list[Any]] = {"env": [], "deviceNodes": []}
                for source in (doc.get("containerEdits") or {}, d["containerEdits"]):
                    for key in edits:
                        edits[key] += source.get(key, [])
                return edits
    raise LookupError(f"no CDI device {qualified}")


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare")
async def test_a_cdi_only_runtime_gets_every_node_cuda_needs_for_a_mig_hold(node: Node, tmp_path: Path) -> None:
    gpu0 = node.hw.inventory().gpus[0]
    assert (await node.hold(f"{gpu0.uuid}/2/0")).state == CONVERGED
    edits = resolve_cdi(node.cdi_dir, f"bc.dev/gpu={gpu0.uuid}_2_0")
    rootfs = tmp_path / "rootfs"
    (rootfs / "dev").mkdir(parents=True)
    lines = ["set -eu", f"mount -t tmpfs -o mode=755 tmpfs {rootfs}/dev"]
    for n in edits["deviceNodes"]:
        target = rootfs / n["path"].lstrip("/")
        lines += [f"mkdir -p {target.parent}", f"mknod -m 666 {target} {n['type']} {n['major']} {n['minor']}"]
    lines.append(f"cd {rootfs} && find dev -type c -exec stat -c '%n %t %T' {{}} + | sort")
    r = subprocess.run(["unshare", "-m", "sh", "-c", "\n".join(lines)], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    made = {p: (int(major, 16), int(minor, 16)) for p, major, minor in (x.split() for x in r.stdout.splitlines())}
    want = {n["path"].lstrip("/"): (n["major"], n["minor"]) for n in edits["deviceNodes"]}
    assert made == want
    names = set(made)
    assert {p.lstrip("/") for p in CONTROL} <= names and f"dev/nvidia{gpu0.index}" in names
    assert len([p for p in names if p.startswith("dev/nvidia-caps/nvidia-cap")]) == 2
    visible = [e for e in edits["env"] if e.startswith("NVIDIA_VISIBLE_DEVICES=")]
    assert visible == [f"NVIDIA_VISIBLE_DEVICES={gpu0.mig_instances[1].uuid}"]
    # The tmpfs lived in the namespace only: nothing was made on this host.
    assert list((rootfs / "dev").iterdir()) == []
    assert not any(stat.S_ISCHR(os.lstat(p).st_mode) for p in tmp_path.rglob("*"))


async def test_a_control_node_that_appears_later_reaches_the_held_spec(node: Node) -> None:
    class UvmLater(FakeDeviceNodes):
        uvm = False

        def control(self) -> list[DevNode]:
            return [n for n in super().control() if self.uvm or "uvm" not in n.path]

    source = UvmLater()
    node.devices.dev_nodes = source
    gpu3 = node.hw.inventory().gpus[3]
    a = spec_pb2.DeviceAssignment(
        allocation_id="w0",
        reservation_id="r",
        binding=spec_pb2.BINDING_HOLD,
        devices=[spec_pb2.DeviceRef(device_class="gpu", atom_id=gpu3.uuid)],
    )
    section = spec_pb2.DevicesSection(assignments=[a])
    assert (await node.devices.converge(section, 1)).state == CONVERGED
    doc = json.loads((node.cdi_dir / "bc-w0.json").read_text())
    assert [n["path"] for n in doc["containerEdits"]["deviceNodes"]] == ["/dev/nvidiactl", "/dev/nvidia-modeset"]

    source.uvm = True  # nvidia_uvm loaded: its nodes exist now
    again = await node.devices.converge(section, 1)
    assert again.state == CONVERGED and again.events == []  # the same hold, nothing reported
    doc = json.loads((node.cdi_dir / "bc-w0.json").read_text())
    assert [n["path"] for n in doc["containerEdits"]["deviceNodes"]] == CONTROL
