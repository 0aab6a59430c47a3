"""The fake hardware: seeded, stable, distinct per node, and shaped like the real thing."""

from __future__ import annotations

import re

import pytest

from agent.hw import FakeHardware, NvmlHardware, inventory_hash, open_backend

GPU_UUID = re.compile(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
MIG_UUID = re.compile(r"MIG-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
PCI = re.compile(r"[0-9A-F]{8}:[0-9A-F]{2}:[0-9A-F]{2}\.[0-7]")


def test_profiles_are_bundled() -> None:
    assert {"hgx-h100-8", "mig-a100-4", "l4-slots-4"} <= set(FakeHardware.profiles())


def test_an_unknown_profile_lists_the_known_ones() -> None:
    with pytest.raises(ValueError, match="hgx-h100-8"):
        FakeHardware("dgx-b200-9000", "node-a")


@pytest.mark.parametrize("profile", ["hgx-h100-8", "mig-a100-4", "l4-slots-4"])
def test_the_same_seed_gives_the_same_gpus(profile: str) -> None:
    a, b = FakeHardware(profile, "node-a").inventory(), FakeHardware(profile, "node-a").inventory()
    assert a == b
    assert inventory_hash(a) == inventory_hash(b)


@pytest.mark.parametrize("profile", ["hgx-h100-8", "mig-a100-4", "l4-slots-4"])
def test_two_nodes_never_share_a_uuid(profile: str) -> None:
    a, b = FakeHardware(profile, "node-a").inventory(), FakeHardware(profile, "node-b").inventory()
    uuids_a = {g.uuid for g in a.gpus} | {m.uuid for g in a.gpus for m in g.mig_instances}
    uuids_b = {g.uuid for g in b.gpus} | {m.uuid for g in b.gpus for m in g.mig_instances}
    assert not uuids_a & uuids_b
    assert inventory_hash(a) != inventory_hash(b)


def test_hgx_h100_8() -> None:
    inv = FakeHardware("hgx-h100-8", "node-a").inventory()
    assert inv.source == "fake:hgx-h100-8"
    assert [g.index for g in inv.gpus] == list(range(8))
    assert len({g.uuid for g in inv.gpus}) == 8
    for g in inv.gpus:
        assert g.name == "NVIDIA H100 80GB HBM3" and g.memory_mib == 81559
        assert GPU_UUID.fullmatch(g.uuid) and PCI.fullmatch(g.pci_bus_id)
        assert not g.mig_enabled and g.slots == 0 and g.healthy
    assert inv.gpus[0].pci_bus_id == "00000000:18:00.0"


def test_mig_a100_4() -> None:
    inv = FakeHardware("mig-a100-4", "node-a").inventory()
    assert [g.mig_enabled for g in inv.gpus] == [True, True, False, False]
    for g in inv.gpus[:2]:
        assert [(m.gi, m.ci, m.profile) for m in g.mig_instances] == [
            (1, 0, "3g.40gb"),
            (2, 0, "2g.20gb"),
            (3, 0, "2g.20gb"),
        ]
        assert all(MIG_UUID.fullmatch(m.uuid) for m in g.mig_instances)
    assert not inv.gpus[2].mig_instances


def test_l4_slots_4() -> None:
    inv = FakeHardware("l4-slots-4", "node-a").inventory()
    assert [(g.name, g.slots) for g in inv.gpus] == [("NVIDIA L4", 4)] * 4


def test_callers_get_a_copy() -> None:
    hw = FakeHardware("hgx-h100-8", "node-a")
    hw.inventory().gpus[0].healthy = False
    assert hw.inventory().gpus[0].healthy


def test_inventory_hash_follows_the_content() -> None:
    inv = FakeHardware("hgx-h100-8", "node-a").inventory()
    h = inventory_hash(inv)
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", h)
    inv.gpus[3].healthy = False
    assert inventory_hash(inv) != h


def test_open_backend() -> None:
    fake = open_backend("l4-slots-4", "node-z")
    assert isinstance(fake, FakeHardware) and fake.seed == "node-z"
    assert "fake:l4-slots-4" in fake.describe()
    assert fake.boot_id()
    assert isinstance(open_backend(None, "node-z"), NvmlHardware)
