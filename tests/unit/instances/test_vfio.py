"""agent.instances.vfio over the fake sysfs tree (agent.instances.fake_vfio): a GPU's IOMMU group moves to
vfio-pci and back, a bridge stays put, a host without vfio-pci fails the bind and leaves nothing moved; a
group's node goes to a VMM user and back."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.instances import vfio
from agent.instances.confine import VMM_UID_BASE, running_vmm_uids
from agent.instances.fake_vfio import FakeVfio, add_device, build_tree

BUS = ["00000000:18:00.0", "00000000:2A:00.0"]
GPU0, AUDIO0, GPU1 = "0000:18:00.0", "0000:18:00.1", "0000:2a:00.0"


@pytest.fixture
def host(tmp_path: Path) -> FakeVfio:
    build_tree(tmp_path, BUS)
    return FakeVfio(tmp_path)


def test_the_tree_looks_like_sysfs(host: FakeVfio, tmp_path: Path) -> None:
    assert host.group(GPU0) == [GPU0, AUDIO0]
    assert (host.driver(GPU0), host.driver(AUDIO0), host.pci_class(GPU0)) == ("nvidia", "snd_hda_intel", "0x030200")
    assert (tmp_path / "bus/pci/devices" / GPU0 / "driver").resolve() == tmp_path / "bus/pci/drivers/nvidia"
    assert (tmp_path / "bus/pci/devices" / GPU0 / "driver_override").read_text() == "(null)\n"


def test_a_group_moves_to_vfio_pci_and_back(host: FakeVfio, tmp_path: Path) -> None:
    moved = vfio.bind_group(host, GPU0)
    assert moved == [vfio.Moved(GPU0, "nvidia"), vfio.Moved(AUDIO0, "snd_hda_intel")]
    assert host.on_vfio() == [GPU0, AUDIO0]  # the other GPU's group is untouched
    assert (tmp_path / "bus/pci/devices" / GPU0 / "driver_override").read_text() == "vfio-pci\n"
    assert vfio.bind_group(host, GPU0) == [vfio.Moved(GPU0, "vfio-pci"), vfio.Moved(AUDIO0, "vfio-pci")]
    assert vfio.release(host, moved) == []
    assert host.on_vfio() == [] and host.driver(GPU0) == "nvidia" and host.driver(AUDIO0) == "snd_hda_intel"
    assert (tmp_path / "bus/pci/devices" / GPU0 / "driver_override").read_text() == "(null)\n"


def test_a_bridge_in_the_group_stays_on_its_driver(host: FakeVfio, tmp_path: Path) -> None:
    add_device(tmp_path, "0000:17:00.0", 1, "0x060400", "pcieport")
    assert host.group(GPU1) == ["0000:17:00.0", GPU1, "0000:2a:00.1"]
    vfio.bind_group(host, GPU1)
    assert host.driver("0000:17:00.0") == "pcieport" and host.on_vfio() == [GPU1, "0000:2a:00.1"]


def test_without_vfio_pci_loaded_the_bind_fails_and_says_so(tmp_path: Path) -> None:
    build_tree(tmp_path, BUS, vfio_loaded=False)
    host = FakeVfio(tmp_path)
    with pytest.raises(vfio.VfioError, match=r"0000:18:00.0, 0000:18:00.1 did not move to vfio-pci \(is the vfio-pci"):
        vfio.bind_group(host, GPU0)
    assert host.driver(GPU0) == ""  # driverless, as the kernel leaves it: release gives it back
    assert vfio.release(host, [vfio.Moved(GPU0, "nvidia"), vfio.Moved(AUDIO0, "snd_hda_intel")]) == []
    assert host.driver(GPU0) == "nvidia"


def test_a_device_without_an_iommu_group(tmp_path: Path) -> None:
    with pytest.raises(vfio.VfioError, match="has no IOMMU group"):
        FakeVfio(tmp_path).group(GPU0)
    with pytest.raises(vfio.VfioError, match="is not a PCI address"):
        FakeVfio(tmp_path).group("../../etc")


def test_nvml_bus_ids_become_sysfs_addresses() -> None:
    assert vfio.sysfs_address("00000000:2A:00.0") == "0000:2a:00.0"
    assert vfio.sysfs_address("0000:18:00.0") == "0000:18:00.0"
    with pytest.raises(vfio.VfioError):
        vfio.sysfs_address("nonsense")


@settings(max_examples=25, deadline=None)  # each example builds a tree on disk
@given(st.lists(st.sampled_from(["bind0", "bind1", "release0", "release1"]), max_size=12))
def test_release_always_gives_back_the_drivers_the_devices_had(steps: list[str]) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        build_tree(root, BUS)
        host = FakeVfio(root)
        first: dict[str, list[vfio.Moved]] = {}
        for step in steps:
            n = step[-1]
            gpu = GPU0 if n == "0" else GPU1
            if step.startswith("bind"):
                moved = vfio.bind_group(host, gpu)
                first.setdefault(n, moved)  # a second bind sees vfio-pci: the first's drivers are the ones to keep
            elif n in first:
                assert vfio.release(host, first.pop(n)) == []
        for moved in first.values():
            vfio.release(host, moved)
        assert host.on_vfio() == []
        assert host.driver(GPU0) == host.driver(GPU1) == "nvidia"


def test_qemu_gets_each_gpu_as_a_vfio_pci_device() -> None:
    from agent.instances import qemu_argv
    from agent.instances.runtime import DomainConfig, RuntimeFailure

    config = DomainConfig("vm", 1, 512, None, None, "", gpus=(GPU0, GPU1))
    argv = qemu_argv.argv(config, "qemu-system-x86_64", ("tcg",), Path("/d"), paused=False, user_data_file=None)
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "-device"] == [
        f"vfio-pci,host={GPU0}",
        f"vfio-pci,host={GPU1}",
    ]
    bad = DomainConfig("vm", 1, 512, None, None, "", gpus=("0000:18:00.0,romfile=/etc/shadow",))
    with pytest.raises(RuntimeFailure, match="is not a PCI address"):
        qemu_argv.gpus(bad)


def node(tmp_path: Path, group: str) -> tuple[int, int, int]:
    st_ = (tmp_path / "dev" / "vfio" / group).stat()
    return st_.st_uid, st_.st_gid, st_.st_mode & 0o7777


def test_a_group_node_is_handed_to_a_vmm_user_and_back(host: FakeVfio, tmp_path: Path) -> None:
    uid = VMM_UID_BASE + 3
    assert node(tmp_path, "0") == (0, 0, 0o600)
    assert vfio.hand_over(host, [GPU0], uid, frozenset()) == ["0"]
    assert node(tmp_path, "0") == (uid, uid, 0o600) and node(tmp_path, "1") == (0, 0, 0o600)
    # while it runs, the group is its: neither given back nor taken by another VMM user
    assert vfio.give_back(host, [GPU0], uid, frozenset({uid})) == []
    with pytest.raises(vfio.VfioError, match=f"VFIO group 0 is held by the running VMM user {uid}"):
        vfio.hand_over(host, [GPU1, GPU0], uid + 1, frozenset({uid}))
    assert node(tmp_path, "1") == (0, 0, 0o600)  # a refusal changes nothing, not even the free group
    assert vfio.give_back(host, [GPU0, AUDIO0], None, frozenset()) == ["0"]
    assert node(tmp_path, "0") == (0, 0, 0o600)


def test_a_symlinked_group_node_is_never_followed(host: FakeVfio, tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_text("")
    (tmp_path / "dev" / "vfio" / "0").unlink()
    (tmp_path / "dev" / "vfio" / "0").symlink_to(target)
    with pytest.raises(vfio.VfioError, match="VFIO group 0 has no device node"):
        vfio.hand_over(host, [GPU0], VMM_UID_BASE, frozenset())
    assert target.stat().st_uid == 0


def test_running_vmm_uids_come_from_the_process_table(tmp_path: Path) -> None:
    for pid, uids in (("1", "0 0 0 0"), ("20", f"{VMM_UID_BASE} {VMM_UID_BASE} {VMM_UID_BASE} {VMM_UID_BASE}")):
        (tmp_path / pid).mkdir()
        (tmp_path / pid / "status").write_text(f"Name:\tx\nUid:\t{uids}\nGid:\t0 0 0 0\n")
    (tmp_path / "21").mkdir()  # a VMM that exited and was not reaped yet
    zombie = VMM_UID_BASE + 1
    (tmp_path / "21" / "status").write_text(
        f"Name:\tx\nState:\tZ (zombie)\nUid:\t{zombie} {zombie} {zombie} {zombie}\n"
    )
    (tmp_path / "self").mkdir()
    assert running_vmm_uids(tmp_path) == {VMM_UID_BASE}
