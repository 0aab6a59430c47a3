"""agent.helper.vm_rules: what root accepts of a node-written instance record and of a GPU's IOMMU group."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.helper.ops import VERSION, Layout, Refused, plan
from agent.helper.plans import VmLaunch
from agent.helper.vm_rules import Device, RecordRefused, check_record, group_refusal, is_host_gpu
from agent.instances.confine import VMM_UID_BASE
from agent.instances.net.names import tap_name

NODE = Path("/var/lib/bc-node")
HERE = NODE / "instances" / "a"
DIGEST = "ab" * 32
GOOD = {
    "id": "a",
    "uid": VMM_UID_BASE,
    "vcpus": 2,
    "memory_mib": 1024,
    "disk": str(HERE / "disk.qcow2"),
    "disk_base": str(NODE / "images" / f"{DIGEST}.qcow2"),
    "kernel": str(NODE / "instance-boot" / "vmlinuz"),
    "volumes": [{"id": "v1", "path": str(NODE / "volumes" / "v1.raw"), "serial": "data-1"}],
    "nics": [{"tap": tap_name("a", 0), "bridge": "br0", "mac": "52:54:00:00:00:0a"}],
    "gpus": ["0000:18:00.0"],
}
VOL = GOOD["volumes"][0]  # type: ignore[index]
NIC0 = GOOD["nics"][0]  # type: ignore[index]


def test_a_record_the_node_writes_is_accepted_with_every_file_it_names() -> None:
    rec = check_record(GOOD, "a", NODE)
    assert (rec.uid, rec.gpus, rec.vcpus, rec.memory_mib) == (VMM_UID_BASE, ("0000:18:00.0",), 2, 1024)
    assert rec.files == (
        HERE / "disk.qcow2",
        NODE / "images" / f"{DIGEST}.qcow2",
        NODE / "instance-boot" / "vmlinuz",
        NODE / "volumes" / "v1.raw",
    )


R = "instance a's record"


@pytest.mark.parametrize(
    "change, message",
    [
        ({"id": "b"}, "the record in instance a's directory is not that instance's"),
        ({"uid": 0}, f"{R} has VMM user '0', outside bc's range"),
        ({"uid": True}, f"{R} has VMM user 'True', outside bc's range"),
        ({"vcpus": 0}, f"{R} has vcpus '0', not an integer from 1 to 1024"),
        ({"memory_mib": 1 << 40}, f"{R} has memory_mib '{1 << 40}', not an integer from 16 to 16777216"),
        ({"disk": "/etc/shadow"}, f"{R} names its disk '/etc/shadow', outside {HERE}"),
        ({"disk": f"{HERE}/../b/disk"}, f"{R} names its disk '{HERE}/../b/disk', outside {HERE}"),
        ({"disk_base": f"{NODE}/images/x.qcow2"},
         f"{R} names its base image '{NODE}/images/x.qcow2', outside {NODE}/images"),
        ({"kernel": "/boot/vmlinuz"}, f"{R} names its kernel '/boot/vmlinuz', outside {NODE}/instance-boot"),
        ({"volumes": [{"path": "/dev/sda"}]}, f"{R} names a volume '/dev/sda', outside {NODE}/volumes"),
        ({"gpus": ["0000:18:00.0,romfile=/x"]}, f"{R} names GPU '0000:18:00.0,romfile=/x', not a PCI address"),
        # What else reaches qemu's key=value option strings: a comma would add options of the node's own.
        ({"disk_format": "qcow2,file.locking=off"}, f"{R} has disk format 'qcow2,file.locking=o'"),
        ({"nics": [{**NIC0, "tap": "bcx,script=/tmp/x"}]}, f"{R} names a tap for NIC 0 that is not its own"),
        ({"nics": [{**NIC0, "tap": tap_name("b", 0)}]}, f"{R} names a tap for NIC 0 that is not its own"),
        ({"nics": [{**NIC0, "mac": "52:54:00:00:00:0a,romfile=/x"}]}, f"{R} has NIC 0 with a MAC that is not one"),
        ({"nics": [{**NIC0, "bridge": "br0,x=y"}]}, f"{R} has NIC 0 on a bridge that is not a name"),
        ({"nics": [NIC0] * 9}, f"{R} has NICs that are not a list of at most 8"),
        ({"volumes": [{**VOL, "serial": "d,drive=x"}]}, f"{R} has volume v1 with a serial that is not one"),
        ({"volumes": [{**VOL, "id": "v 1"}]}, f"{R} has a volume whose id is not one"),
    ],
)  # fmt: skip
def test_each_refusal_says_why_in_one_sentence(change: dict[str, object], message: str) -> None:
    with pytest.raises(RecordRefused) as e:
        check_record({**GOOD, **change}, "a", NODE)
    assert str(e.value) == message


GPU = Device("0000:18:00.0", "0x030200", "0x10de")
AUDIO = Device("0000:18:00.1", "0x040300", "0x10de")
BRIDGE = Device("0000:17:00.0", "0x060400", "0x10b5")
NIC = Device("0000:19:00.0", "0x020000", "0x8086")


def test_a_gpu_group_with_its_functions_and_bridges_moves_and_nothing_else_does() -> None:
    assert group_refusal(GPU.address, [BRIDGE, GPU, AUDIO]) is None
    assert group_refusal(GPU.address, [GPU, AUDIO, NIC]) == (
        "the IOMMU group of 0000:18:00.0 also holds 0000:19:00.0 (class 0x020000), which is not a GPU's"
    )
    assert group_refusal(NIC.address, [NIC]) == (
        "0000:19:00.0 is not one of this host's GPUs (an NVIDIA display or 3D controller)"
    )
    assert group_refusal(GPU.address, [AUDIO]) is not None  # not in the group sysfs gave


devices = st.builds(
    Device,
    st.sampled_from(["0000:18:00.0", "0000:18:00.1", "0000:19:00.0", "0000:17:00.0"]),
    st.sampled_from(["0x030200", "0x030000", "0x040300", "0x060400", "0x020000", "0x010802"]),
    st.sampled_from(["0x10de", "0x8086", "0x1002"]),
)


@given(st.lists(devices, max_size=5, unique_by=lambda d: d.address))
def test_an_accepted_group_holds_only_gpus_their_functions_and_bridges(members: list[Device]) -> None:
    if group_refusal("0000:18:00.0", members) is None:
        slots = {d.address.rsplit(".", 1)[0] for d in members if is_host_gpu(d)}
        assert any(d.address == "0000:18:00.0" and is_host_gpu(d) for d in members)
        assert all(
            is_host_gpu(d) or d.pci_class.startswith("0x0604") or d.address.rsplit(".", 1)[0] in slots for d in members
        )


@pytest.mark.parametrize(
    "request_, message",
    [
        ({"op": "vm.launch", "instance_id": "a", "accel": ["kvm", "kvm"]}, "accel must be a list of kvm and tcg"),
        ({"op": "vm.launch", "instance_id": "a", "accel": ["hvf"]}, "accel must be a list of kvm and tcg"),
        ({"op": "vm.launch", "instance_id": "a", "paused": "yes"}, "paused must be true or false"),
        ({"op": "vm.launch", "instance_id": "a", "argv": ["sh"]}, "vm.launch takes no argv"),
        ({"op": "vm.stop", "instance_id": "A/../b"}, "instance_id 'A/../b' is not an instance id"),
        ({"op": "vm.vfio", "instance_id": "a", "gpus": ["0000:18:00.0"]}, "vm.vfio takes no gpus"),
        ({"op": "vm.grant-volume", "instance_id": "a", "volume_id": "../../etc/shadow"},
         "volume_id '../../etc/shadow' is not a volume id"),
        ({"op": "vm.grant-volume", "instance_id": "a", "volume_id": "v1", "path": "/dev/sda"},
         "vm.grant-volume takes no path"),
        ({"op": "vm.revoke-volume", "instance_id": "a"}, "volume_id must be a string of at most 80 characters"),
    ],
)  # fmt: skip
def test_a_vm_request_names_the_instance_and_nothing_root_builds(request_: dict[str, object], message: str) -> None:
    with pytest.raises(Refused, match=re.escape(message)):
        plan({"v": VERSION, **request_}, Layout(Path("/")))


def test_launch_paths_are_the_layout_s() -> None:
    (effect,) = plan({"v": VERSION, "op": "vm.launch", "instance_id": "a", "user_data": True}, Layout(Path("/r")))
    assert effect == VmLaunch(Path("/r/var/lib/bc-node/instances"), "a", False, Path("/r/run/bc/user-data/a"))
