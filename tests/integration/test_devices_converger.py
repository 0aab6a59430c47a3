"""The devices converger over real files: holds become CDI specs and env files, and come back from disk."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft7Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT7

from agent.converge import env_files
from agent.converge.devices import DevicesConverger
from agent.converge.run import CONVERGED, FAILED, PROGRESSING, run
from agent.hw import cdi
from agent.hw.fake import FakeHardware
from bc.protocol.pb import session_pb2, spec_pb2

SHARED_SCHEMA = Path(__file__).resolve().parents[3] / "shared" / "cdi-schema"
BUNDLED_SCHEMA = Path(__file__).resolve().parents[2] / "agent" / "hw" / "cdi_schema"
SCHEMA_DIR = SHARED_SCHEMA if SHARED_SCHEMA.is_dir() else BUNDLED_SCHEMA
CDI_NAME = re.compile(r"[A-Za-z0-9_.:-]+")
BOUND = session_pb2.AllocationReport.BOUND
RELEASED = session_pb2.AllocationReport.RELEASED
FAILED_KIND = session_pb2.AllocationReport.FAILED


def cdi_validator() -> Draft7Validator:
    schema = json.loads((SCHEMA_DIR / "schema.json").read_text())
    defs = json.loads((SCHEMA_DIR / "defs.json").read_text())
    registry: Registry[Any] = Registry().with_resource(
        "defs.json", Resource.from_contents(defs, default_specification=DRAFT7)
    )
    return Draft7Validator(schema, registry=registry)


def assert_valid_cdi(doc: dict[str, Any]) -> None:
    errors = list(cdi_validator().iter_errors(doc))
    assert not errors, [e.message for e in errors]
    assert doc["kind"].count("/") == 1
    for d in doc["devices"]:
        assert "/" not in d["name"] and CDI_NAME.fullmatch(d["name"])


class Node:
    """One node's devices converger over tmp dirs, and helpers to build its desired section."""

    def __init__(self, tmp: Path, profile: str = "hgx-h100-8", node_id: str = "node-a") -> None:
        self.tmp = tmp
        self.cdi_dir = tmp / "etc" / "cdi"
        self.env_dir = tmp / "run" / "bc" / "allocations"
        self.mps_dir = tmp / "run" / "nvidia-mps"
        self.hw = FakeHardware(profile, node_id)
        self.inv = self.hw.inventory()
        self.node_id = node_id
        self.converger = self.fresh()

    def fresh(self) -> DevicesConverger:
        return DevicesConverger(self.cdi_dir, self.env_dir, self.hw, self.node_id, mps_pipe_dir=self.mps_dir)

    def cdi(self, allocation_id: str) -> dict[str, Any]:
        doc: dict[str, Any] = json.loads((self.cdi_dir / f"bc-{allocation_id}.json").read_text())
        return doc

    def env(self, allocation_id: str) -> list[str]:
        """The env file's KEY=VALUE lines, after checking its first line is our marker."""
        first, *lines = (self.env_dir / f"bc-{allocation_id}.env").read_text().splitlines()
        assert first == env_files.marker(allocation_id), first
        return lines


def assignment(
    allocation_id: str,
    *refs: tuple[str, str],
    binding: int = spec_pb2.BINDING_HOLD,
    env: tuple[str, ...] = (),
    reservation_id: str = "",
) -> spec_pb2.DeviceAssignment:
    return spec_pb2.DeviceAssignment(
        allocation_id=allocation_id,
        reservation_id=reservation_id or f"res-{allocation_id}",
        binding=binding,  # type: ignore[arg-type]
        devices=[spec_pb2.DeviceRef(device_class=c, atom_id=i) for c, i in refs],
        env=list(env),
    )


def section(*assignments: spec_pb2.DeviceAssignment) -> spec_pb2.DevicesSection:
    return spec_pb2.DevicesSection(assignments=list(assignments))


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return Node(tmp_path)


async def test_bind_two_gpus_writes_a_valid_cdi_spec_and_env_file(node: Node) -> None:
    g0, g1 = node.inv.gpus[0].uuid, node.inv.gpus[1].uuid
    a = assignment("alloc-1", ("gpu", g0), ("gpu", g1), env=("HF_HOME=/data/hf",))
    result = await node.converger.converge(section(a), 5)

    assert result.state == CONVERGED
    [ev] = result.events
    assert ev.kind == BOUND
    assert (ev.node_id, ev.allocation_id, ev.reservation_id, ev.generation) == (
        "node-a",
        "alloc-1",
        "res-alloc-1",
        5,
    )
    assert list(ev.cdi_devices) == [f"bc.dev/gpu={g0}", f"bc.dev/gpu={g1}"]

    doc = node.cdi("alloc-1")
    assert_valid_cdi(doc)
    assert doc["cdiVersion"] == "0.6.0" and doc["kind"] == "bc.dev/gpu"
    assert doc["annotations"] == {"bc.dev/allocation-id": "alloc-1", "bc.dev/reservation-id": "res-alloc-1"}
    assert [d["annotations"]["bc.dev/device-id"] for d in doc["devices"]] == [g0, g1]
    expected_env = [f"NVIDIA_VISIBLE_DEVICES={g0},{g1}", "BC_ALLOCATION_ID=alloc-1", "HF_HOME=/data/hf"]
    assert doc["containerEdits"]["env"] == expected_env
    assert node.env("alloc-1") == expected_env
    assert not [p for p in node.cdi_dir.iterdir() if p.name.startswith(".")]  # no temp files left


async def test_converging_twice_reports_once(node: Node) -> None:
    a = assignment("alloc-1", ("gpu", node.inv.gpus[0].uuid))
    first = await node.converger.converge(section(a), 5)
    second = await node.converger.converge(section(a), 5)
    third = await node.converger.converge(section(a), 6)
    assert [e.kind for e in first.events] == [BOUND]
    assert second.events == [] and third.events == []
    assert second.state == third.state == CONVERGED


async def test_a_missing_env_file_is_rewritten_silently(node: Node) -> None:
    a = assignment("alloc-1", ("gpu", node.inv.gpus[0].uuid))
    await node.converger.converge(section(a), 5)
    (node.env_dir / "bc-alloc-1.env").unlink()
    again = await node.converger.converge(section(a), 5)
    assert again.events == [] and again.state == CONVERGED
    assert node.env("alloc-1")[1] == "BC_ALLOCATION_ID=alloc-1"


async def test_removing_the_assignment_releases_it(node: Node) -> None:
    a = assignment("alloc-1", ("gpu", node.inv.gpus[0].uuid))
    await node.converger.converge(section(a), 5)
    result = await node.converger.converge(section(), 6)
    assert result.state == CONVERGED
    [ev] = result.events
    assert (ev.kind, ev.allocation_id, ev.reservation_id, ev.generation, ev.node_id) == (
        RELEASED,
        "alloc-1",
        "res-alloc-1",
        6,
        "node-a",
    )
    assert not (node.cdi_dir / "bc-alloc-1.json").exists()
    assert not (node.env_dir / "bc-alloc-1.env").exists()


async def test_an_empty_spec_releases_through_run(node: Node) -> None:
    a = assignment("alloc-1", ("gpu", node.inv.gpus[0].uuid))
    await run(spec_pb2.NodeSpec(devices=section(a)), 1, {"devices": node.converger})
    out = await run(spec_pb2.NodeSpec(), 2, {"devices": node.converger})
    assert [e.kind for e in out.events] == [RELEASED]
    assert out.observed
    assert list(node.cdi_dir.iterdir()) == []


async def test_whole_gpu_overlapping_a_held_mig_instance_fails(tmp_path: Path) -> None:
    node = Node(tmp_path, "mig-a100-4")
    g0 = node.inv.gpus[0].uuid
    mig = assignment("alloc-mig", ("gpu.mig", f"{g0}/1/0"))
    whole = assignment("alloc-whole", ("gpu", g0))
    other = assignment("alloc-other", ("gpu", node.inv.gpus[2].uuid))
    await node.converger.converge(section(mig), 1)

    result = await node.converger.converge(section(mig, whole, other), 2)
    assert result.state == FAILED and result.terminal
    assert result.reason == "AllocationFailed" and "alloc-whole: overlap" in result.message
    by_id = {e.allocation_id: e for e in result.events}
    assert by_id["alloc-whole"].kind == FAILED_KIND and by_id["alloc-whole"].reason == "overlap"
    assert by_id["alloc-whole"].generation == 2 and by_id["alloc-whole"].node_id == "node-a"
    assert by_id["alloc-other"].kind == BOUND  # the others still bind
    assert "alloc-mig" not in by_id
    assert not (node.cdi_dir / "bc-alloc-whole.json").exists()

    # Same generation again: the section stays failed, but the failure is not reported twice.
    again = await node.converger.converge(section(mig, whole, other), 2)
    assert again.state == FAILED and again.events == []
    out = await run(spec_pb2.NodeSpec(devices=section(mig, whole, other)), 2, {"devices": node.converger})
    assert out.observed  # a terminal failure lets the generation be observed

    # A new generation reports it again.
    later = await node.converger.converge(section(mig, whole, other), 3)
    assert [(e.allocation_id, e.reason) for e in later.events] == [("alloc-whole", "overlap")]


async def test_a_mig_instance_under_a_held_whole_gpu_fails(tmp_path: Path) -> None:
    node = Node(tmp_path, "mig-a100-4")
    g0 = node.inv.gpus[0].uuid
    whole = assignment("alloc-whole", ("gpu", g0))
    mig = assignment("alloc-mig", ("gpu.mig", f"{g0}/2/0"))
    await node.converger.converge(section(whole), 1)
    result = await node.converger.converge(section(whole, mig), 2)
    assert [(e.allocation_id, e.kind, e.reason) for e in result.events] == [("alloc-mig", FAILED_KIND, "overlap")]


async def test_a_missing_device_fails(node: Node) -> None:
    a = assignment("alloc-1", ("gpu", "GPU-00000000-0000-0000-0000-000000000000"))
    result = await node.converger.converge(section(a), 4)
    assert result.state == FAILED and result.terminal
    [ev] = result.events
    assert (ev.kind, ev.reason, ev.allocation_id, ev.reservation_id) == (
        FAILED_KIND,
        "device-missing",
        "alloc-1",
        "res-alloc-1",
    )
    assert list(node.cdi_dir.iterdir()) == []


@pytest.mark.parametrize(
    ("ref", "binding", "reason"),
    [
        (("gpu.mig", "{g0}/9/0"), spec_pb2.BINDING_HOLD, "device-missing"),
        (("nic", "{g0}"), spec_pb2.BINDING_HOLD, "unsupported-device"),
        (("gpu", "{g0}"), 7, "unsupported-binding"),
    ],
)
async def test_refusals(tmp_path: Path, ref: tuple[str, str], binding: int, reason: str) -> None:
    node = Node(tmp_path, "mig-a100-4")
    a = assignment("alloc-1", (ref[0], ref[1].format(g0=node.inv.gpus[0].uuid)), binding=binding)
    result = await node.converger.converge(section(a), 1)
    assert [(e.kind, e.reason) for e in result.events] == [(FAILED_KIND, reason)]


async def test_a_fresh_converger_reads_the_holds_back(node: Node) -> None:
    g = node.inv.gpus
    a = assignment("alloc-1", ("gpu", g[0].uuid), ("gpu", g[1].uuid))
    b = assignment("alloc-2", ("gpu", g[1].uuid))
    await node.converger.converge(section(a), 1)

    restarted = node.fresh()  # a new process: nothing in memory
    result = await restarted.converge(section(a, b), 1)
    assert [(e.allocation_id, e.kind, e.reason) for e in result.events] == [("alloc-2", FAILED_KIND, "overlap")]
    released = await restarted.converge(section(b), 2)
    assert [(e.allocation_id, e.kind) for e in released.events] == [("alloc-1", RELEASED), ("alloc-2", BOUND)]


async def test_mig_instances_resolve_to_their_mig_uuids(tmp_path: Path) -> None:
    node = Node(tmp_path, "mig-a100-4")
    g0, g1, g2 = node.inv.gpus[0], node.inv.gpus[1], node.inv.gpus[2]
    a = assignment(
        "alloc-1",
        ("gpu.mig", f"{g0.uuid}/1/0"),
        ("gpu.mig", f"{g1.uuid}/3/0"),
        ("gpu", g2.uuid),
    )
    result = await node.converger.converge(section(a), 1)
    assert result.state == CONVERGED
    doc = node.cdi("alloc-1")
    assert_valid_cdi(doc)
    visible = f"NVIDIA_VISIBLE_DEVICES={g0.mig_instances[0].uuid},{g1.mig_instances[2].uuid},{g2.uuid}"
    assert doc["containerEdits"]["env"][0] == visible
    assert node.env("alloc-1")[0] == visible
    assert [d["name"] for d in doc["devices"]] == [f"{g0.uuid}_1_0", f"{g1.uuid}_3_0", g2.uuid]
    assert result.events[0].cdi_devices[0] == f"bc.dev/gpu={g0.uuid}_1_0"


async def test_slots_name_their_gpu_once_and_get_mps(tmp_path: Path) -> None:
    node = Node(tmp_path, "l4-slots-4")
    node.mps_dir.mkdir(parents=True)
    g0 = node.inv.gpus[0].uuid
    a = assignment("alloc-1", ("gpu.slot", f"{g0}/s0"), ("gpu.slot", f"{g0}/s1"))
    b = assignment("alloc-2", ("gpu.slot", f"{g0}/s2"))
    result = await node.converger.converge(section(a, b), 1)
    assert [e.kind for e in result.events] == [BOUND, BOUND]
    assert node.env("alloc-1") == [
        f"NVIDIA_VISIBLE_DEVICES={g0}",
        "BC_ALLOCATION_ID=alloc-1",
        f"CUDA_MPS_PIPE_DIRECTORY={node.mps_dir}",
    ]
    assert_valid_cdi(node.cdi("alloc-2"))


async def test_kubernetes_holds_carry_the_binding_and_no_visible_devices(node: Node) -> None:
    a = assignment("alloc-k", ("gpu", node.inv.gpus[0].uuid), binding=spec_pb2.BINDING_KUBERNETES)
    result = await node.converger.converge(section(a), 1)
    assert [e.kind for e in result.events] == [BOUND]
    doc = node.cdi("alloc-k")
    assert_valid_cdi(doc)
    assert doc["annotations"]["bc.dev/binding"] == "kubernetes"
    assert not any(line.startswith("NVIDIA_VISIBLE_DEVICES=") for line in doc["containerEdits"]["env"])
    assert node.env("alloc-k") == ["BC_ALLOCATION_ID=alloc-k"]
    # Unchanged on the next pass, after a restart too.
    assert (await node.fresh().converge(section(a), 2)).events == []


async def test_a_changed_assignment_is_bound_again(node: Node) -> None:
    g = node.inv.gpus
    await node.converger.converge(section(assignment("alloc-1", ("gpu", g[0].uuid))), 1)
    result = await node.converger.converge(section(assignment("alloc-1", ("gpu", g[1].uuid))), 2)
    assert [(e.kind, list(e.cdi_devices)) for e in result.events] == [(BOUND, [f"bc.dev/gpu={g[1].uuid}"])]
    assert [d["annotations"]["bc.dev/device-id"] for d in node.cdi("alloc-1")["devices"]] == [g[1].uuid]


async def test_changed_env_is_rewritten_without_an_event(node: Node) -> None:
    g0 = node.inv.gpus[0].uuid
    await node.converger.converge(section(assignment("alloc-1", ("gpu", g0), env=("A=1",))), 1)
    result = await node.converger.converge(section(assignment("alloc-1", ("gpu", g0), env=("A=2",))), 2)
    assert result.events == [] and result.state == CONVERGED
    assert node.env("alloc-1")[-1] == "A=2"
    assert node.cdi("alloc-1")["containerEdits"]["env"][-1] == "A=2"


async def test_a_held_hold_whose_device_vanished_is_kept(tmp_path: Path) -> None:
    node = Node(tmp_path)
    a = assignment("alloc-1", ("gpu", node.inv.gpus[7].uuid))
    await node.converger.converge(section(a), 1)
    inv = node.hw.inventory()
    del inv.gpus[7]
    node.hw.inventory = lambda: inv  # type: ignore[method-assign]
    result = await node.converger.converge(section(a), 1)
    assert result.events == [] and result.state == CONVERGED
    assert (node.cdi_dir / "bc-alloc-1.json").exists()


async def test_foreign_cdi_files_are_left_alone(node: Node) -> None:
    node.cdi_dir.mkdir(parents=True)
    (node.cdi_dir / "nvidia.yaml").write_text("cdiVersion: 0.5.0\n")
    (node.cdi_dir / "bc-garbage.json").write_text("{not json")
    result = await node.converger.converge(section(), 1)
    assert result.state == CONVERGED and result.events == []
    assert (node.cdi_dir / "nvidia.yaml").exists() and (node.cdi_dir / "bc-garbage.json").exists()


async def test_an_unusable_directory_is_retryable(node: Node) -> None:
    node.env_dir.parent.mkdir(parents=True)
    node.env_dir.write_text("not a directory")  # the env dir cannot be created
    a = assignment("alloc-1", ("gpu", node.inv.gpus[0].uuid))
    out = await run(spec_pb2.NodeSpec(devices=section(a)), 1, {"devices": node.converger})
    devices = next(s for s in out.statuses if s.section == "devices")
    assert devices.state == PROGRESSING and not out.observed
    node.env_dir.unlink()
    out = await run(spec_pb2.NodeSpec(devices=section(a)), 1, {"devices": node.converger})
    assert [e.kind for e in out.events] == [BOUND] and out.observed


async def test_invalid_assignments_are_refused(node: Node) -> None:
    g0 = node.inv.gpus[0].uuid
    bad = [
        assignment("../../etc/passwd", ("gpu", g0)),
        assignment("alloc-env", ("gpu", g0), env=("NVIDIA_VISIBLE_DEVICES=all",)),
        assignment("alloc-nl", ("gpu", g0), env=("A=1\nB=2",)),
        assignment("alloc-empty"),
    ]
    result = await node.converger.converge(section(*bad), 1)
    assert [e.reason for e in result.events] == ["invalid-assignment"] * 4
    assert list(node.cdi_dir.iterdir()) == []


async def test_a_failed_write_keeps_the_section_progressing(node: Node, monkeypatch: pytest.MonkeyPatch) -> None:
    real_write = cdi.atomic_write

    def read_only(path: Path, data: bytes, mode: int = 0o644) -> None:
        raise OSError(30, "Read-only file system", str(path))

    a = assignment("alloc-1", ("gpu", node.inv.gpus[0].uuid))
    monkeypatch.setattr(cdi, "atomic_write", read_only)
    result = await node.converger.converge(section(a), 1)
    assert (result.state, result.terminal, result.reason) == (FAILED, False, "WriteFailed")
    assert result.events == [] and "Read-only" in result.message
    monkeypatch.setattr(cdi, "atomic_write", real_write)
    result = await node.converger.converge(section(a), 1)
    assert result.state == CONVERGED and [e.kind for e in result.events] == [BOUND]


async def test_a_failed_release_holds_back_binds_that_need_its_atoms(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    g0 = node.inv.gpus[0].uuid
    await node.converger.converge(section(assignment("alloc-old", ("gpu", g0))), 1)
    real_remove = cdi.remove_file

    def stuck(path: Path) -> bool:
        if path.name.startswith("bc-"):
            raise OSError(16, "Device or resource busy", str(path))
        return real_remove(path)

    new = assignment("alloc-new", ("gpu", g0))
    monkeypatch.setattr(cdi, "remove_file", stuck)
    result = await node.converger.converge(section(new), 2)
    assert (result.state, result.terminal) == (FAILED, False)
    assert result.events == []
    assert not (node.cdi_dir / "bc-alloc-new.json").exists()
    monkeypatch.setattr(cdi, "remove_file", real_remove)
    result = await node.converger.converge(section(new), 2)
    assert [(e.allocation_id, e.kind) for e in result.events] == [
        ("alloc-old", RELEASED),
        ("alloc-new", BOUND),
    ]


async def test_an_orphan_env_file_is_removed(node: Node) -> None:
    node.env_dir.mkdir(parents=True)
    (node.env_dir / "bc-ghost.env").write_bytes(env_files.env_bytes("ghost", ["BC_ALLOCATION_ID=ghost"]))
    a = assignment("alloc-1", ("gpu", node.inv.gpus[0].uuid))
    await node.converger.converge(section(a), 1)
    assert sorted(p.name for p in node.env_dir.iterdir()) == ["bc-alloc-1.env"]


async def test_env_files_we_did_not_write_are_left_alone(node: Node) -> None:
    """A shared env dir: only `bc-<id>.env` files that start with our marker for that id are ever deleted."""
    node.env_dir.mkdir(parents=True)
    theirs = {
        "ghost.env": "BC_ALLOCATION_ID=ghost\n",  # the old naming, or another tool's
        "bc-other.env": "PATH=/usr/bin\n",  # our naming, no marker
        "bc-swapped.env": env_files.env_bytes("another", ["A=1"]).decode(),  # a marker for another allocation
        "bc-..env": env_files.env_bytes(".", []).decode(),  # not a valid allocation id
        "app.env": "A=1\n",
    }
    for name, text in theirs.items():
        (node.env_dir / name).write_text(text)
    a = assignment("alloc-1", ("gpu", node.inv.gpus[0].uuid))
    await node.converger.converge(section(a), 1)
    await node.converger.converge(section(), 2)  # the release, and an orphan sweep after it
    assert {p.name: p.read_text() for p in node.env_dir.iterdir()} == theirs
