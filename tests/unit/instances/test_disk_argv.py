"""qemu's argv for the root disk and the volumes (agent.instances.qemu_argv), and the unit's paths for them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.instances import qemu_argv
from agent.instances.confine import VMM_UID_BASE, transient_unit_argv
from agent.instances.runtime import DomainConfig, RuntimeFailure, VolumeConfig


def config(**kw: object) -> DomainConfig:
    base: dict[str, object] = {"kernel": None, "initrd": None, "cmdline": ""}
    return DomainConfig("vm1", 1, 256, **{**base, **kw})  # type: ignore[arg-type]


def test_the_root_disk_is_the_first_device_and_boots_without_a_kernel(tmp_path: Path) -> None:
    disk = tmp_path / "disk.qcow2"
    vol = VolumeConfig("data_" + "x" * 70, tmp_path / "v.raw", "data-1", read_only=True)
    argv = qemu_argv.argv(
        config(disk=disk, volumes=(vol,)), "qemu", ("tcg",), tmp_path, paused=False, user_data_file=None
    )
    devices = [argv[i + 1] for i, a in enumerate(argv) if a == "-device"]
    node = qemu_argv.volume_node(vol.id)
    assert devices == [
        "virtio-blk-pci,id=droot,drive=root,bootindex=0",
        f"virtio-blk-pci,id=d{node},drive={node},serial=data-1",
    ]
    assert len(node) <= 31  # qemu's limit on node names, whatever the id's length
    blockdevs = [json.loads(argv[i + 1]) for i, a in enumerate(argv) if a == "-blockdev"]
    assert blockdevs[0] == {
        "driver": "qcow2",
        "node-name": "root",
        "cache": {"direct": True},
        "file": {"driver": "file", "filename": str(disk), "aio": "threads"},
    }
    assert blockdevs[1] == {
        "driver": "raw",
        "node-name": node,
        "file": {"driver": "file", "filename": str(vol.path), "aio": "threads"},
        "read-only": True,
    }
    with_kernel = qemu_argv.disks(config(disk=disk, kernel=tmp_path / "vmlinuz"))
    assert with_kernel[-1] == "virtio-blk-pci,id=droot,drive=root"  # -kernel takes bootindex 0 itself


def test_a_volume_path_with_a_comma_is_refused(tmp_path: Path) -> None:
    vol = VolumeConfig("v", tmp_path / "a,b.raw", "s")
    with pytest.raises(RuntimeFailure, match="hold a comma"):
        qemu_argv.argv(config(volumes=(vol,)), "qemu", (), tmp_path, paused=False, user_data_file=None)


def test_the_unit_binds_the_base_read_only_and_the_written_volumes_read_write(tmp_path: Path) -> None:
    base, rw = tmp_path / "images" / "b.qcow2", tmp_path / "volumes" / "v.raw"
    argv = transient_unit_argv("vm1", VMM_UID_BASE, 1, 256, tmp_path, tmp_path / "p", [base], writable=[rw])
    assert f"BindReadOnlyPaths={base}" in argv and f"ReadWritePaths={rw}" in argv
