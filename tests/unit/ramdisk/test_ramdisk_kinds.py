"""The ramdisk kinds' payload rules, the boot journal's name, and boot.kexec through the fake kexec edge."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.kinds import REGISTRY, InvalidPayload
from agent.ramdisk.journal_path import boot_journal
from bc.protocol import kinds as kind_table
from bc.protocol.pb import kinds_pb2
from tests.unit.kinds.kind_helpers import pack

MIB = 1 << 20


def test_the_kind_table_flags_follow_the_reference() -> None:
    wipe, deploy, kexec = (kind_table.KINDS[k] for k in ("disk.wipe", "deploy.image", "boot.kexec"))
    assert (wipe.lane, wipe.attested, wipe.destructive, wipe.retry_safe) == ("provision", True, True, False)
    assert (deploy.lane, deploy.attested, deploy.destructive, deploy.retry_safe) == ("provision", False, True, False)
    assert (kexec.lane, kexec.self_terminating, kexec.destructive, kexec.retry_safe) == ("control", True, False, False)
    assert (wipe.timeout_s, deploy.timeout_s, kexec.timeout_s) == (6 * 3600, 3600, 15 * 60)
    assert wipe.roles == deploy.roles == kexec.roles == frozenset({"ramdisk"})


def test_a_wipe_names_its_disks_and_a_method_it_knows() -> None:
    with pytest.raises(InvalidPayload, match="disks is empty"):
        REGISTRY["disk.wipe"].parse(pack(kinds_pb2.DiskWipeRequest()))
    with pytest.raises(InvalidPayload, match="is not one of auto, overwrite"):
        REGISTRY["disk.wipe"].parse(pack(kinds_pb2.DiskWipeRequest(disks=["sda"], method="shred")))
    req = REGISTRY["disk.wipe"].parse(pack(kinds_pb2.DiskWipeRequest(disks=["sda", "nvme0n1", "sda"])))
    assert REGISTRY["disk.wipe"].resources(req) == ["disk:sda", "disk:nvme0n1"]


@pytest.mark.parametrize(
    ("url", "sha", "words"),
    [
        ("file:///etc/shadow", "a" * 64, "not an http"),
        ("ftp://cache/os.raw", "a" * 64, "not an http"),
        ("http:///os.raw", "a" * 64, "not an http"),
        ("http://cache/os.raw", "A" * 64, "64 lowercase hex"),
        ("http://cache/os.raw", "a" * 63, "64 lowercase hex"),
    ],
)
def test_a_deploy_takes_an_http_url_and_a_sha256(url: str, sha: str, words: str) -> None:
    with pytest.raises(InvalidPayload, match=words):
        REGISTRY["deploy.image"].parse(pack(kinds_pb2.DeployImageRequest(url=url, sha256=sha, disk="sda")))


@given(st.text(max_size=60))
def test_a_kexec_path_is_absolute_and_normalised_or_refused(path: str) -> None:
    req = kinds_pb2.BootKexecRequest(disk="sda", partition=1, kernel=path)
    good = path.startswith("/") and path == __import__("posixpath").normpath(path) and len(path) <= 255
    try:
        REGISTRY["boot.kexec"].parse(pack(req))
    except InvalidPayload:
        assert not good
    else:
        assert good and ".." not in path.split("/")


def test_a_kexec_command_line_is_one_line() -> None:
    req = kinds_pb2.BootKexecRequest(disk="sda", partition=1, kernel="/boot/vmlinuz", cmdline="ro\ninit=/bin/sh")
    with pytest.raises(InvalidPayload, match="one line"):
        REGISTRY["boot.kexec"].parse(pack(req))


def test_each_boot_has_a_journal_of_its_own(tmp_path: Path) -> None:
    first = boot_journal(tmp_path, "0b1d-aa")
    first.write_bytes(b"journal")
    (tmp_path / (first.name + "-wal")).write_bytes(b"wal")
    assert boot_journal(tmp_path, "0b1d-aa") == first and first.exists(), "a restart within the boot keeps it"
    second = boot_journal(tmp_path, "77ee-bb")
    assert second != first and not first.exists() and not list(tmp_path.glob("*-wal"))
    assert boot_journal(tmp_path, "../../x").parent == tmp_path
