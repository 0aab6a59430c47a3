"""agent.instances.snapshot_meta and snapshot_tar: what a snapshot is, what a restore refuses, the disk check."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.instances.fake_snapshot import flat_qcow2, qcow2_header
from agent.instances.snapshot_meta import (
    GPU_REFUSAL,
    VOLUME_REFUSAL,
    SnapshotError,
    SnapshotMeta,
    check_restore,
    memory_refusal,
    parse_meta,
)
from agent.instances.snapshot_tar import build, check_flat_qcow2, unpack
from bc.protocol.pb import spec_pb2

META = SnapshotMeta("qemu", "AMD EPYC 7B13", True, 2, 512, True)


def test_meta_round_trips_and_names_what_a_restore_checks() -> None:
    doc = json.loads(META.encode())
    assert doc == {
        "v": 1, "runtime": "qemu", "cpu_model": "AMD EPYC 7B13", "include_memory": True, "vcpus": 2,
        "memory_mib": 512, "disk": True,
    }  # fmt: skip
    assert parse_meta(META.encode()) == META


@pytest.mark.parametrize(
    ("doc", "why"),
    [
        ({"v": 2}, "not version 1"),
        ({**json.loads(META.encode()), "runtime": ""}, "no runtime"),
        ({**json.loads(META.encode()), "vcpus": True}, "no vcpus"),
        ({**json.loads(META.encode()), "memory_mib": -1}, "no memory_mib"),
        ({**json.loads(META.encode()), "include_memory": "yes"}, "no include_memory flag"),
        ([1], "not version 1"),
    ],
)
def test_a_meta_that_is_not_ours_is_refused(doc: object, why: str) -> None:
    with pytest.raises(SnapshotError, match=why):
        parse_meta(json.dumps(doc).encode())


@given(st.binary(max_size=300))
def test_any_bytes_parse_or_raise_one_sentence(data: bytes) -> None:
    try:
        parse_meta(data)
    except SnapshotError as e:
        assert "\n" not in str(e)


def test_a_restore_refuses_another_runtime_another_cpu_and_another_size() -> None:
    check_restore(META, "qemu", "AMD EPYC 7B13", 2, 512)
    with pytest.raises(SnapshotError, match="taken by runtime 'qemu', not 'libvirt-kvm'"):
        check_restore(META, "libvirt-kvm", "AMD EPYC 7B13", 2, 512)
    with pytest.raises(SnapshotError, match="only on the CPU model it was taken on"):
        check_restore(META, "qemu", "Intel Xeon", 2, 512)
    with pytest.raises(SnapshotError, match="of 2 vCPUs and 512 MiB restores only into an instance of that size"):
        check_restore(META, "qemu", "AMD EPYC 7B13", 2, 1024)
    disk_only = SnapshotMeta("qemu", "AMD EPYC 7B13", False, 2, 512, True)
    check_restore(disk_only, "qemu", "Intel Xeon", 4, 4096)  # a disk restores anywhere, into any size


def test_a_memory_snapshot_is_refused_with_gpus_or_a_read_write_volume() -> None:
    inst = spec_pb2.Instance(id="a")
    assert memory_refusal(inst) is None
    inst.volumes.add(volume="ro", read_only=True)
    assert memory_refusal(inst) is None
    inst.volumes.add(volume="rw")
    assert memory_refusal(inst) == VOLUME_REFUSAL
    assert memory_refusal(spec_pb2.Instance(id="b", gpus=["GPU-1"])) == GPU_REFUSAL


def _files(tmp: Path) -> tuple[Path, Path]:
    disk, memory = tmp / "d.qcow2", tmp / "m.state"
    disk.write_bytes(flat_qcow2() + b"\0" * 5000)
    memory.write_bytes(b"state" * 1000)
    return disk, memory


def test_a_tar_built_unpacks_into_an_instance_directory(tmp_path: Path) -> None:
    disk, memory = _files(tmp_path)
    sha, size = build(tmp_path / "s.tar", META, disk, memory)
    assert size == (tmp_path / "s.tar").stat().st_size and len(sha) == 64
    into = tmp_path / "vm"
    into.mkdir()
    seen: list[SnapshotMeta] = []
    assert unpack(tmp_path / "s.tar", into, seen.append) == META == seen[0]
    assert (into / "disk.qcow2").read_bytes() == disk.read_bytes()
    assert (into / "memory.state").read_bytes() == memory.read_bytes()
    assert (into / "disk.qcow2").stat().st_mode & 0o777 == 0o600


def _tar(path: Path, members: list[tarfile.TarInfo | tuple[str, bytes]]) -> None:
    with tarfile.open(path, "w") as tar:
        for m in members:
            if isinstance(m, tarfile.TarInfo):
                tar.addfile(m)
            else:
                info = tarfile.TarInfo(m[0])
                info.size = len(m[1])
                tar.addfile(info, io.BytesIO(m[1]))


@pytest.mark.parametrize(
    ("members", "why"),
    [
        ([("disk.qcow2", flat_qcow2())], "does not start with meta.json"),
        ([("meta.json", META.encode()), ("../etc/passwd", b"x")], "not one of"),
        ([("meta.json", META.encode()), ("meta.json", META.encode())], "holds meta.json twice"),
        ([("meta.json", META.encode()), ("disk.qcow2", flat_qcow2())], "its memory.state disagree"),
        ([("meta.json", META.encode()), ("memory.state", b"m")], "its disk.qcow2 disagree"),
        ([("meta.json", META.encode()), ("disk.qcow2", b"MZ not a qcow2" * 10), ("memory.state", b"m")], "not a qcow2"),
    ],
)
def test_a_tar_that_is_not_a_snapshot_is_refused(tmp_path: Path, members: list[tuple[str, bytes]], why: str) -> None:
    _tar(tmp_path / "s.tar", list(members))
    (tmp_path / "vm").mkdir()
    with pytest.raises(SnapshotError, match=why):
        unpack(tmp_path / "s.tar", tmp_path / "vm", lambda m: None)


def test_a_link_member_is_refused_and_nothing_is_followed(tmp_path: Path) -> None:
    link = tarfile.TarInfo("disk.qcow2")
    link.type, link.linkname = tarfile.SYMTYPE, "/etc/shadow"
    _tar(tmp_path / "s.tar", [("meta.json", META.encode()), link])
    (tmp_path / "vm").mkdir()
    with pytest.raises(SnapshotError, match=r"disk\.qcow2 is not a regular file"):
        unpack(tmp_path / "s.tar", tmp_path / "vm", lambda m: None)
    assert not (tmp_path / "vm" / "disk.qcow2").exists()


def test_the_check_stops_the_unpack_before_any_disk_is_written(tmp_path: Path) -> None:
    disk, memory = _files(tmp_path)
    build(tmp_path / "s.tar", META, disk, memory)
    (tmp_path / "vm").mkdir()

    def refuse(m: SnapshotMeta) -> None:
        raise SnapshotError("another CPU model")

    with pytest.raises(SnapshotError, match="another CPU model"):
        unpack(tmp_path / "s.tar", tmp_path / "vm", refuse)
    assert list((tmp_path / "vm").iterdir()) == []


@pytest.mark.parametrize(
    ("header", "why"),
    [
        (qcow2_header(backing=512), "names a backing file"),
        (qcow2_header(crypt=1), "is encrypted"),
        (qcow2_header(incompatible=0b100), "names an external data file"),
        (qcow2_header(incompatible=1 << 40), "feature bits bc does not know"),
        (qcow2_header(version=4), "version 4"),
        (b"QFI\xfb", "truncated qcow2 header"),
        (b"\x7fELF" + b"\0" * 200, "is not a qcow2 image"),
    ],
)
def test_a_restored_disk_must_be_a_flat_plain_qcow2(tmp_path: Path, header: bytes, why: str) -> None:
    (tmp_path / "d").write_bytes(header)
    with pytest.raises(SnapshotError, match=why):
        check_flat_qcow2(tmp_path / "d")
    (tmp_path / "ok").write_bytes(qcow2_header())
    check_flat_qcow2(tmp_path / "ok")
