"""bc.protocol.disk_rules through the section's check: images, volumes and what an instance names of them."""

from __future__ import annotations

import pytest
from google.protobuf import json_format
from hypothesis import given
from hypothesis import strategies as st

from bc.protocol import disk_rules
from bc.protocol.canonical import SpecError
from bc.protocol.pb import spec_pb2
from bc.protocol.spec_validation import check_section

SHA = "ab" * 32
IMAGE = {"name": "debian-12", "url": "https://img.example/d.qcow2", "sha256": SHA, "format": "qcow2"}
VOLUME = {"id": "data_1", "serial": "data-1", "sizeBytes": 1 << 30}
INST = {"id": "vm-1", "runtime": "qemu", "vcpus": 1, "memoryMib": 256, "image": "debian-12"}


def section(
    inst: dict[str, object] | None = None,
    image: dict[str, object] | None = None,
    volume: dict[str, object] | None = None,
    **more: object,
) -> spec_pb2.InstancesSection:
    doc = {
        "instances": [{**INST, **(inst or {})}],
        "images": [{**IMAGE, **(image or {})}],
        "volumes": [{**VOLUME, **(volume or {})}],
        **more,
    }
    return json_format.ParseDict(doc, spec_pb2.InstancesSection())


def refusal(s: spec_pb2.InstancesSection) -> str:
    with pytest.raises(SpecError) as e:
        check_section("instances", s)
    assert "\n" not in str(e.value)
    return str(e.value)


def test_an_image_instance_with_a_volume_and_a_size_passes() -> None:
    check_section("instances", section({"volumes": [{"volume": "data_1", "readOnly": True}], "diskSizeBytes": 4 << 30}))
    check_section("instances", section({"kernel": "vmlinuz", "image": ""}))  # a kernel alone, as before


@pytest.mark.parametrize(
    "kw, field, words",
    [
        (
            {"image": {"url": "http://img.example/d.qcow2"}},
            "images[0].url",
            "is not an https:// URL; images are fetched over https only",
        ),
        ({"image": {"url": "file:///etc/shadow"}}, "images[0].url", "is not an https:// URL"),
        ({"image": {"sha256": "AB" * 32}}, "images[0].sha256", "must be 64 lowercase hex digits"),
        ({"image": {"format": "iso"}}, "images[0].format", "must be one of qcow2, raw, not 'iso'"),
        ({"image": {"name": "../x"}}, "images[0].name", "is not an image name"),
        ({"volume": {"id": "a/b"}}, "volumes[0].id", "is not a volume id (1-80 of A-Z a-z 0-9 _ -)"),
        ({"volume": {"id": "v" * 81}}, "volumes[0].id", "is not a volume id"),
        ({"volume": {"serial": "Data"}}, "volumes[0].serial", "is not a serial (1-20 of a-z 0-9 -)"),
        ({"volume": {"sizeBytes": 1000}}, "volumes[0].size_bytes", "must be a positive multiple of 512 bytes"),
        ({"volume": {"sizeBytes": 0}}, "volumes[0].size_bytes", "must be a positive multiple of 512 bytes"),
        ({"inst": {"image": "nope"}}, "instances[0].image", "'nope' is not an image of the section's images"),
        ({"inst": {"diskSizeBytes": 1000}}, "instances[0].disk_size_bytes", "multiple of 512"),
        (
            {"inst": {"image": "", "kernel": "vmlinuz", "diskSizeBytes": 512}},
            "instances[0].disk_size_bytes",
            "needs an image",
        ),
        (
            {"inst": {"volumes": [{"volume": "other"}]}},
            "instances[0].volumes[0].volume",
            "'other' is not a volume of the section's volumes",
        ),
        (
            {"inst": {"volumes": [{"volume": "data_1"}, {"volume": "data_1"}]}},
            "instances[0].volumes[1].volume",
            "is attached twice",
        ),
    ],
)
def test_a_bad_disk_field_is_refused_in_one_sentence(kw: dict[str, dict[str, object]], field: str, words: str) -> None:
    message = refusal(section(kw.get("inst"), kw.get("image"), kw.get("volume")))
    assert message.startswith(f"the instances section's {field} "), message
    assert words in message


def test_names_ids_and_serials_are_unique() -> None:
    s = section()
    s.images.add().CopyFrom(s.images[0])
    assert "images[1].name 'debian-12' appears twice" in refusal(s)
    s = section()
    s.volumes.add().CopyFrom(s.volumes[0])
    assert "volumes[1].id 'data_1' appears twice" in refusal(s)
    s = section()
    s.volumes.add(id="other", serial="data-1", size_bytes=512)
    assert "volumes[1].serial 'data-1' is another volume's serial" in refusal(s)


@given(st.text(max_size=90))
def test_a_volume_id_is_never_a_path(text: str) -> None:
    try:
        disk_rules.check_volume(spec_pb2.Volume(id=text, serial="s", size_bytes=512), "v")
    except disk_rules.DiskRuleError:
        return
    assert "/" not in text and "." not in text and 1 <= len(text) <= 80


@given(st.integers(min_value=-(1 << 62), max_value=1 << 62))
def test_a_size_is_a_positive_multiple_of_a_sector(n: int) -> None:
    try:
        disk_rules.check_volume(spec_pb2.Volume(id="v", serial="s", size_bytes=n), "v")
    except disk_rules.DiskRuleError:
        assert n <= 0 or n % 512 or n > disk_rules.MAX_DISK_BYTES
        return
    assert n > 0 and n % 512 == 0
