"""agent.instances.confine: VMM uids, the transient unit's properties, and what `grant` opens to a VMM."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.instances.confine import (
    VMM_UID_BASE,
    VMM_UID_SPAN,
    grant,
    is_vmm_uid,
    pick_uid,
    transient_unit_argv,
    unit_name,
)


def test_pick_the_lowest_free_uid() -> None:
    assert pick_uid([]) == VMM_UID_BASE
    assert pick_uid([VMM_UID_BASE, VMM_UID_BASE + 2]) == VMM_UID_BASE + 1
    with pytest.raises(ValueError, match="every VMM uid is taken"):
        pick_uid(range(VMM_UID_BASE, VMM_UID_BASE + VMM_UID_SPAN))
    assert is_vmm_uid(VMM_UID_BASE) and not is_vmm_uid(0) and not is_vmm_uid(True) and not is_vmm_uid("1")


@given(st.from_regex(r"[a-z0-9][a-z0-9-]{0,62}", fullmatch=True))
def test_a_unit_name_is_always_a_service(iid: str) -> None:
    name = unit_name(iid)
    assert name.endswith(".service") and name.count(".") == 1 and "/" not in name


def test_the_transient_unit_carries_the_sandbox_and_the_flavor_limits(tmp_path: Path) -> None:
    argv = transient_unit_argv(
        "web-1", VMM_UID_BASE + 7, 4, 8192, tmp_path / "web-1", tmp_path / "web-1/qemu.pid", [Path("/k")], gpus=True
    )
    assert argv[:5] == [
        "systemd-run",
        "--unit=bc-vm-web-1.service",
        "--collect",
        "--slice=bc-instances.slice",
        "--quiet",
    ]
    assert argv[-1] == "--"
    props = [argv[i + 1] for i, a in enumerate(argv) if a == "-p"]
    for want in (
        f"User={VMM_UID_BASE + 7}",
        "NoNewPrivileges=yes",
        "CapabilityBoundingSet=",
        "DevicePolicy=closed",
        "DeviceAllow=/dev/vfio/vfio rw",
        "ProtectSystem=strict",
        "IPAddressDeny=any",
        f"ReadWritePaths={tmp_path / 'web-1'}",
        "BindReadOnlyPaths=/k",
        "MemoryMax=8704M",  # 8192 + 256 + 256
        "TasksMax=144",
        "CPUQuota=500%",
        "Type=forking",
    ):
        assert want in props, want
    huge = transient_unit_argv("a", VMM_UID_BASE, 1, 2048, tmp_path, tmp_path / "p", [], hugepages=True)
    assert "MemoryMax=320M" in huge  # only the overhead: the guest's memory is in huge pages
    assert not any("vfio" in a for a in huge)


def test_grant_opens_exactly_what_the_vmm_needs(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.fail("grant chowns files: run as root (CI does)")
    data = tmp_path / "data"
    inst = data / "instances" / "a"
    inst.mkdir(parents=True, mode=0o700)
    (data / "instances").chmod(0o700)
    data.chmod(0o700)
    disk = inst / "disk.qcow2"
    disk.write_bytes(b"d")
    ud_dir = tmp_path / "ud"
    ud_dir.mkdir(mode=0o700)
    ud = ud_dir / "a"
    ud.write_bytes(b"u")
    ud.chmod(0o600)
    boot = data / "instance-boot"
    boot.mkdir(mode=0o700)
    kern = boot / "vmlinuz"
    kern.write_bytes(b"k")
    kern.chmod(0o644)
    uid = VMM_UID_BASE + 3
    grant(uid, inst, [data, ud_dir], [disk], [ud], [kern])

    def mode(p: Path) -> tuple[int, int, int]:
        s = p.stat()
        return stat.S_IMODE(s.st_mode), s.st_uid, s.st_gid

    assert mode(inst) == (0o1770, 0, uid)
    assert mode(disk) == (0o660, 0, uid)
    assert mode(ud) == (0o640, 0, uid)
    assert mode(kern) == (0o644, 0, 0)  # shared: never re-grouped
    assert mode(data) == (0o701, 0, 0) and mode(data / "instances") == (0o701, 0, 0) and mode(boot) == (0o701, 0, 0)
    assert mode(ud_dir) == (0o701, 0, 0)
    assert mode(tmp_path)[0] & 0o001 == stat.S_IMODE(os.stat(tmp_path).st_mode) & 0o001  # above the anchors: untouched
    kern.chmod(0o600)
    with pytest.raises(PermissionError, match="is not readable by others, and a confined VMM must read it"):
        grant(uid, inst, [data], [], [], [kern])
