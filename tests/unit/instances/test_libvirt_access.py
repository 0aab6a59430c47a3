"""What the libvirt runtime opens up for a qemu that runs as libvirt's own user: search on the directories from the
data directory down to the domain's files and on the user-data directory, nothing else."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from agent.instances.libvirt_access import domain_files, grant_search, search_dirs
from agent.instances.runtime import DomainConfig, VolumeConfig

TOP = Path("/var/lib/bc")


def test_the_directories_from_the_data_directory_down_to_each_file() -> None:
    config = DomainConfig(
        "vm1", 1, 256, TOP / "instance-boot/vmlinuz", TOP / "instance-boot/initrd", "",
        disk=TOP / "libvirt/vm1/disk.qcow2", disk_base=TOP / "images/ab.qcow2",
        volumes=(VolumeConfig("v", TOP / "volumes/v/v.raw", "s"),),
    )  # fmt: skip
    files = domain_files(config)
    assert files == [
        TOP / "instance-boot/vmlinuz",
        TOP / "instance-boot/initrd",
        TOP / "libvirt/vm1/disk.qcow2",
        TOP / "images/ab.qcow2",
        TOP / "volumes/v/v.raw",
    ]
    assert search_dirs(TOP, files, Path("/run/bc/user-data/vm1")) == [
        Path("/run/bc/user-data"),
        TOP,
        TOP / "images",
        TOP / "instance-boot",
        TOP / "libvirt",
        TOP / "libvirt/vm1",
        TOP / "volumes",
        TOP / "volumes/v",
    ]


def test_a_file_outside_the_data_directory_opens_nothing() -> None:
    assert search_dirs(TOP, [Path("/boot/vmlinuz"), Path("/var/lib/bcx/f")]) == []


@given(st.lists(st.lists(st.sampled_from(["a", "b", "c"]), min_size=1, max_size=4), max_size=5))
def test_only_directories_under_the_top_on_the_way_to_a_file(paths: list[list[str]]) -> None:
    files = [TOP.joinpath(*p) for p in paths]
    got = search_dirs(TOP, files)
    assert got == sorted(set(got))
    for d in got:
        assert d == TOP or TOP in d.parents
        assert any(d == f.parent or d in f.parents for f in files)
    for f in files:
        assert f.parent in got


def test_grant_search_adds_only_o_x_and_never_through_a_symlink(tmp_path: Path) -> None:
    closed = tmp_path / "closed"
    closed.mkdir(mode=0o700)
    os.chmod(closed, 0o700)
    already = tmp_path / "already"
    already.mkdir()
    os.chmod(already, 0o751)
    link = tmp_path / "link"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.chmod(elsewhere, 0o700)
    link.symlink_to(elsewhere)
    grant_search([closed, already, link])
    assert stat.S_IMODE(closed.stat().st_mode) == 0o701
    assert stat.S_IMODE(already.stat().st_mode) == 0o751
    assert stat.S_IMODE(elsewhere.stat().st_mode) == 0o700
