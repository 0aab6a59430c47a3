"""CDI documents and the pure plan of a devices pass."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from agent.converge.devices import Bind, Fail, Refresh, Release, plan
from agent.hw import cdi
from agent.hw.fake import FakeHardware
from bc.protocol.atoms import parse_atom
from bc.protocol.pb import spec_pb2

BUNDLED = Path(cdi.__file__).parent / "cdi_schema"
SHARED = Path(__file__).resolve().parents[4] / "shared" / "cdi-schema"


@pytest.mark.skipif(not SHARED.is_dir(), reason="the shared CDI schema is not on this machine")
@pytest.mark.parametrize("name", ["schema.json", "defs.json", "LICENSE"])
def test_the_bundled_schema_is_the_shared_one(name: str) -> None:
    assert (BUNDLED / name).read_bytes() == (SHARED / name).read_bytes()


def sample() -> dict[str, Any]:
    atom = parse_atom("gpu.mig", "GPU-1/1/0")
    dev = cdi.ResolvedDevice(atom, "MIG-1", 0)
    env = cdi.env_lines("a1", [dev], kubernetes=False)
    return cdi.render_spec("a1", "r1", [dev], env, kubernetes=False)


def test_a_rendered_spec_validates() -> None:
    doc = sample()
    cdi.validate_spec(doc)
    assert doc["devices"][0]["name"] == "GPU-1_1_0"
    assert doc["containerEdits"]["env"] == ["NVIDIA_VISIBLE_DEVICES=MIG-1", "BC_ALLOCATION_ID=a1"]


@pytest.mark.parametrize(
    "breakage",
    [
        lambda d: d.pop("devices"),
        lambda d: d["devices"][0].pop("containerEdits"),
        lambda d: d.update(kind="bc.dev/gpu/mig"),
        lambda d: d.update(kind="gpu"),
        lambda d: d["devices"][0].update(name="GPU-1/1/0"),
        lambda d: d["devices"].append(copy.deepcopy(d["devices"][0])),
        lambda d: d["containerEdits"].update(env="A=1"),
    ],
)
def test_validation_refuses_what_a_runtime_would(breakage: Any) -> None:
    doc = sample()
    breakage(doc)
    with pytest.raises(cdi.CdiError):
        cdi.validate_spec(doc)


@pytest.mark.parametrize(
    ("line", "ok"),
    [
        ("HF_HOME=/data", True),
        ("EMPTY=", True),
        ("NO_EQUALS", False),
        ("1BAD=x", False),
        ("A=1\nB=2", False),
        ("BC_ALLOCATION_ID=other", False),
        ("NVIDIA_VISIBLE_DEVICES=all", False),
    ],
)
def test_env_lines(line: str, ok: bool) -> None:
    assert (cdi.check_env_line(line) is None) == ok


@pytest.mark.parametrize(("aid", "ok"), [("01J9ZK3Q", True), ("a.b-c_d:e", True), ("../x", False), (".x", False)])
def test_allocation_ids_are_safe_file_names(aid: str, ok: bool) -> None:
    assert cdi.valid_allocation_id(aid) == ok


def test_a_file_whose_name_and_annotation_disagree_is_not_a_hold(tmp_path: Path) -> None:
    doc = sample()
    (tmp_path / "bc-other.json").write_text(json.dumps(doc))
    (tmp_path / "bc-a1.json").write_text(json.dumps(doc))
    assert list(cdi.read_holds(tmp_path)) == ["a1"]


def test_atomic_write_replaces_whole_files(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "f.json"
    cdi.atomic_write(target, b"one")
    cdi.atomic_write(target, b"two")
    assert target.read_bytes() == b"two"
    assert [p.name for p in target.parent.iterdir()] == ["f.json"]
    assert cdi.remove_file(target) and not cdi.remove_file(target)


def ref(c: str, i: str) -> spec_pb2.DeviceRef:
    return spec_pb2.DeviceRef(device_class=c, atom_id=i)


def test_the_plan_releases_first_then_held_then_new(tmp_path: Path) -> None:
    inv = FakeHardware("hgx-h100-8", "n").inventory()
    g = [x.uuid for x in inv.gpus]
    held_a = spec_pb2.DeviceAssignment(
        allocation_id="held", reservation_id="r", binding=spec_pb2.BINDING_HOLD, devices=[ref("gpu", g[1])]
    )
    gone = spec_pb2.DeviceAssignment(
        allocation_id="gone", reservation_id="r", binding=spec_pb2.BINDING_HOLD, devices=[ref("gpu", g[2])]
    )
    # Write the two holds through a plan of their own, then read them back.
    for action in plan([held_a, gone], {}, inv):
        assert isinstance(action, Bind)
        cdi.atomic_write(cdi.spec_path(tmp_path, action.assignment.allocation_id), cdi.spec_bytes(action.doc))
    held = cdi.read_holds(tmp_path)
    # `new` wants GPU 1, which `held` keeps although `new` comes first in the section.
    new = spec_pb2.DeviceAssignment(allocation_id="new", binding=spec_pb2.BINDING_HOLD, devices=[ref("gpu", g[1])])
    actions = plan([new, held_a], held, inv)
    assert [type(a) for a in actions] == [Release, Refresh, Fail]
    assert isinstance(actions[2], Fail) and actions[2].reason == "overlap"
