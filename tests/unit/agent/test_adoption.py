"""A node whose journal holds no spec keeps every hold in its CDI directory until a signed spec says otherwise.

The rule (`agent.converge.adoption`) on its own, then the devices converger
over real files: holds bound at some generation, the journal lost (the
converge loop then runs the empty NodeSpec at generation 0), and what the
first spec after that does.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.converge import env_files
from agent.converge.adoption import NO_SPEC, REASON_JOURNAL_LOST, adopted_status, holds_to_keep
from agent.converge.devices import DevicesConverger
from agent.converge.run import CONVERGED, PROGRESSING, run
from agent.hw import cdi
from agent.hw.fake import FakeHardware
from bc.protocol.atoms import infer_atom
from bc.protocol.pb import session_pb2, spec_pb2

RELEASED = session_pb2.AllocationReport.RELEASED
BOUND = session_pb2.AllocationReport.BOUND


def fake_hold(allocation_id: str) -> cdi.HeldSpec:
    uuid = "GPU-00000000-0000-0000-0000-000000000001"
    return cdi.HeldSpec(allocation_id, f"res-{allocation_id}", False, (infer_atom(uuid),), {}, Path("/x"))


allocation_ids = st.sets(st.from_regex(r"[a-z][a-z0-9-]{0,12}", fullmatch=True), max_size=10)


@given(allocation_ids)
def test_without_a_spec_every_hold_found_is_kept(ids: set[str]) -> None:
    held = {a: fake_hold(a) for a in ids}
    kept = holds_to_keep(held, NO_SPEC)
    assert kept == held


@given(allocation_ids, st.integers(min_value=1, max_value=2**40))
def test_with_a_spec_the_spec_decides(ids: set[str], generation: int) -> None:
    assert holds_to_keep({a: fake_hold(a) for a in ids}, generation) is None


def test_the_status_names_what_is_kept_and_nothing_kept_is_converged() -> None:
    status = adopted_status({"a1": fake_hold("a1"), "a2": fake_hold("a2")}, Path("/etc/cdi"))
    assert (status.reported_state, status.reason) == (PROGRESSING, REASON_JOURNAL_LOST)
    assert status.message == (
        "the journal holds no spec: keeping the 2 holds found in /etc/cdi (a1, a2) until a signed spec says otherwise"
    )
    many = adopted_status({f"a{i:02}": fake_hold(f"a{i:02}") for i in range(10)}, Path("/etc/cdi"))
    assert "the 10 holds" in many.message and "a07 and 2 more" in many.message
    empty = adopted_status({}, Path("/etc/cdi"))
    assert (empty.state, empty.reason, empty.message) == (CONVERGED, "", "")


# -- the devices converger over real files ---------------------------------------------------


class Node:
    def __init__(self, tmp: Path) -> None:
        self.cdi_dir = tmp / "cdi"
        self.env_dir = tmp / "allocations"
        self.hw = FakeHardware("hgx-h100-8", "n1")
        self.gpus = [g.uuid for g in self.hw.inventory().gpus]

    def converger(self) -> DevicesConverger:
        """A new converger, as a restarted agent builds: nothing in memory."""
        return DevicesConverger(self.cdi_dir, self.env_dir, self.hw, "n1", mps_pipe_dir=self.cdi_dir / "no-mps")

    def files(self) -> dict[str, bytes]:
        return {f"{d.name}/{p.name}": p.read_bytes() for d in (self.cdi_dir, self.env_dir) for p in sorted(d.iterdir())}


def assignment(allocation_id: str, gpu: str) -> spec_pb2.DeviceAssignment:
    return spec_pb2.DeviceAssignment(
        allocation_id=allocation_id,
        reservation_id=f"res-{allocation_id}",
        binding=spec_pb2.BINDING_HOLD,
        devices=[spec_pb2.DeviceRef(device_class="gpu", atom_id=gpu)],
        env=["HF_HOME=/data/hf"],
    )


def spec(*assignments: spec_pb2.DeviceAssignment) -> spec_pb2.NodeSpec:
    return spec_pb2.NodeSpec(devices=spec_pb2.DevicesSection(assignments=list(assignments)))


@pytest.fixture
async def held_node(tmp_path: Path) -> Node:
    """A node that bound two allocations at generation 4 and then lost its journal."""
    node = Node(tmp_path)
    a, b = assignment("alloc-a", node.gpus[0]), assignment("alloc-b", node.gpus[1])
    out = await run(spec(a, b), 4, {"devices": node.converger()})
    assert [e.kind for e in out.events] == [BOUND, BOUND] and out.observed
    return node


async def test_a_lost_journal_releases_nothing_and_says_so(held_node: Node) -> None:
    before = held_node.files()
    converger = held_node.converger()
    for _ in range(3):  # the drift pass, again and again while the control plane is away
        out = await run(spec_pb2.NodeSpec(), NO_SPEC, {"devices": converger})
        assert out.events == []
        assert held_node.files() == before
    devices = next(s for s in out.statuses if s.section == "devices")
    assert (devices.state, devices.reason) == (PROGRESSING, REASON_JOURNAL_LOST)
    assert "alloc-a, alloc-b" in devices.message and str(held_node.cdi_dir) in devices.message
    assert not out.observed


async def test_an_adopted_holds_missing_env_file_is_restored_from_its_cdi_file(held_node: Node) -> None:
    before = held_node.files()
    (held_node.env_dir / "bc-alloc-a.env").unlink()  # /run is empty after a reboot
    await held_node.converger().converge(spec_pb2.DevicesSection(), NO_SPEC)
    assert held_node.files() == before


async def test_the_first_spec_keeps_what_it_contains_and_releases_what_it_lacks(held_node: Node) -> None:
    converger = held_node.converger()
    await converger.converge(spec_pb2.DevicesSection(), NO_SPEC)
    before = held_node.files()

    same = spec(assignment("alloc-a", held_node.gpus[0]), assignment("alloc-b", held_node.gpus[1]))
    out = await run(same, 9, {"devices": converger})
    assert out.events == [] and out.observed  # already held as they are: nothing rewritten, nothing reported
    assert held_node.files() == before

    out = await run(spec(assignment("alloc-a", held_node.gpus[0])), 10, {"devices": converger})
    assert [(e.allocation_id, e.kind, e.generation) for e in out.events] == [("alloc-b", RELEASED, 10)]
    assert sorted(held_node.files()) == ["allocations/bc-alloc-a.env", "cdi/bc-alloc-a.json"]


async def test_a_spec_without_the_holds_releases_them(held_node: Node) -> None:
    converger = held_node.converger()
    await converger.converge(spec_pb2.DevicesSection(), NO_SPEC)
    out = await run(spec_pb2.NodeSpec(), 1, {"devices": converger})
    assert sorted((e.allocation_id, e.kind) for e in out.events) == [("alloc-a", RELEASED), ("alloc-b", RELEASED)]
    assert held_node.files() == {}


async def test_a_brand_new_node_has_nothing_to_adopt(tmp_path: Path) -> None:
    node = Node(tmp_path)
    out = await run(spec_pb2.NodeSpec(), NO_SPEC, {"devices": node.converger()})
    devices = next(s for s in out.statuses if s.section == "devices")
    assert (devices.state, devices.reason, out.events) == (CONVERGED, "", [])


async def test_only_our_cdi_files_are_adopted(held_node: Node) -> None:
    (held_node.cdi_dir / "nvidia.yaml").write_text("cdiVersion: 0.5.0\n")
    (held_node.cdi_dir / "bc-broken.json").write_text("{not json")
    result = await held_node.converger().converge(spec_pb2.DevicesSection(), NO_SPEC)
    assert "the 2 holds" in result.message and "broken" not in result.message
    assert (held_node.cdi_dir / "nvidia.yaml").exists() and (held_node.cdi_dir / "bc-broken.json").exists()


def test_env_files_start_with_the_marker_of_their_allocation() -> None:
    data = env_files.env_bytes("alloc-a", ["A=1"])
    assert data.decode().splitlines() == [env_files.marker("alloc-a"), "A=1"]
