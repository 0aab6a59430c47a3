"""bc.protocol.instance_rules: what an instances section may say, and the server's one-sentence refusal."""

from __future__ import annotations

import pytest
from google.protobuf import json_format
from hypothesis import given
from hypothesis import strategies as st

from bc.protocol import instance_rules as rules
from bc.protocol import secret_refs
from bc.protocol.canonical import SpecError
from bc.protocol.pb import spec_pb2
from bc.protocol.spec_validation import check_section

GOOD = {"id": "vm-1", "runtime": "qemu", "vcpus": 2, "memory_mib": 512, "kernel": "vmlinuz", "initrd": "init.cpio"}


def section(**changes: object) -> spec_pb2.InstancesSection:
    doc = {**GOOD, **changes}
    return json_format.ParseDict({"instances": [doc]}, spec_pb2.InstancesSection())


@pytest.mark.parametrize("state", ["", "RUNNING", "PAUSED", "STOPPED", "DELETED"])
def test_every_desired_state_passes(state: str) -> None:
    s = section(state=state)
    rules.check_section(s)
    assert rules.desired_state(s.instances[0]) == (state or "RUNNING")


@pytest.mark.parametrize(
    "changes, field, words",
    [
        ({"id": "VM_1"}, "id", "is not an instance id"),
        ({"id": "a" * 64}, "id", "is not an instance id"),
        ({"id": "-a"}, "id", "is not an instance id"),
        ({"state": "running"}, "state", "must be one of RUNNING, PAUSED, STOPPED, DELETED"),
        ({"runtime": "libvirt-kvm"}, "runtime", "must be one of qemu, libvirt"),
        ({"vcpus": 0}, "vcpus", "between 1 and 256"),
        ({"memory_mib": 8}, "memory_mib", "between 16 and"),
        (
            {"kernel": "", "initrd": ""},
            "kernel",
            "is empty and so is image: an instance boots a kernel, an image or a snapshot",
        ),
        ({"kernel": ""}, "initrd", "needs a kernel: an image boots its own"),
        ({"kernel": "../../etc/shadow"}, "kernel", "is not a file name"),
        ({"initrd": "/boot/initrd.img"}, "initrd", "is not a file name"),
        ({"cmdline": "console=ttyS0 \u00e9"}, "cmdline", "printable ASCII"),
        ({"image": "https://img.example/u.qcow2"}, "image", "is not an image name"),
        ({"image": "ubuntu"}, "image", "'ubuntu' is not an image of the section's images"),
        ({"nics": [{"bridge": "bc0", "mac": "52:54:00:00:00:01"}]}, "nics[0].bridge", "starts with 'bc'"),
        ({"nics": [{"bridge": "br0", "mac": "53:54:00:00:00:01"}]}, "nics[0].mac", "is a multicast address"),
        ({"networkPolicy": "PRIVATE", "nics": [{"bridge": "br0"}]}, "nics[0]", "a policy that cannot be expressed"),
        ({"gpus": ["GPU-1"]}, "gpus", "needs the instance's allocation_id: passthrough GPUs are booked by"),
        ({"gpus": ["-rf"], "allocationId": "a1"}, "gpus", "'-rf' is not a GPU UUID"),
        ({"gpus": ["GPU-1/0/0"], "allocationId": "a1"}, "gpus", "is not a GPU UUID"),
        ({"gpus": ["GPU-1", "GPU-1"], "allocationId": "a1"}, "gpus", "names a GPU twice"),
        ({"gpus": [f"GPU-{i}" for i in range(17)], "allocationId": "a1"}, "gpus", "lists 17 GPUs, more than 16"),
        ({"userDataSecretRef": "Cloud Init"}, "user_data_secret_ref", "is not a secret name"),
        ({"userDataSecretRef": "../etc/passwd"}, "user_data_secret_ref", "is not a secret name"),
        ({"userDataSecretRef": "ud-"}, "user_data_secret_ref", "is not a secret name"),
    ],
)
def test_the_server_refuses_a_bad_instance_in_one_sentence(changes: dict[str, object], field: str, words: str) -> None:
    with pytest.raises(SpecError) as e:
        check_section("instances", section(**changes))
    message = str(e.value)
    assert message.startswith(f"the instances section's instances[0].{field} "), message
    assert words in message and "\n" not in message


def test_an_id_twice_is_refused() -> None:
    s = section()
    s.instances.add().CopyFrom(s.instances[0])
    with pytest.raises(rules.InstanceRuleError, match=r"instances\[1\]\.id 'vm-1' appears twice"):
        rules.check_section(s)


@given(st.text(max_size=80))
def test_an_id_is_never_a_path_nor_long(text: str) -> None:
    inst = spec_pb2.Instance(**{**GOOD, "id": text})  # type: ignore[arg-type]
    try:
        rules.check_instance(inst)
    except rules.InstanceRuleError:
        return
    assert "/" not in text and "." not in text and 1 <= len(text) <= 63 and text == text.lower()


def test_gpus_of_an_allocation_pass() -> None:
    rules.check_section(section(gpus=["GPU-1", "GPU-2"], allocationId="alloc-1"))


def test_one_gpu_for_two_instances_is_refused() -> None:
    s = section(gpus=["GPU-1"], allocationId="alloc-1")
    other = s.instances.add()
    other.CopyFrom(s.instances[0])
    other.id = "vm-2"
    with pytest.raises(
        rules.InstanceRuleError, match=r"instances\[1\]\.gpus GPU GPU-1 is also passed through to instance vm-1"
    ):
        rules.check_section(s)


def test_user_data_names_a_secret_by_the_secret_rule() -> None:
    rules.check_section(section(userDataSecretRef="vm-1.user-data"))


@given(st.text(max_size=140))
def test_a_user_data_ref_passes_exactly_when_it_is_a_secret_name(text: str) -> None:
    inst = spec_pb2.Instance(**{**GOOD, "user_data_secret_ref": text})  # type: ignore[arg-type]
    try:
        rules.check_instance(inst)
        passed = True
    except rules.InstanceRuleError as e:
        assert e.field == "instance.user_data_secret_ref" and "\n" not in e.why.replace(repr(text), "")
        passed = False
    assert passed == (text == "" or secret_refs.NAME_RE.fullmatch(text) is not None)
