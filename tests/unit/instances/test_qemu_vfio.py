"""A confined qemu start hands its GPUs' VFIO group nodes to the VMM's user, and its stop, delete or a failed
start gives them back to root (agent.instances.qemu over the fake VFIO tree). The VMM is `/bin/true` run
through the same `setpriv` drop: what is under test is the hand-over around it, not a guest."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from agent.instances.confine import VMM_UID_BASE
from agent.instances.fake_vfio import FakeVfio, build_tree
from agent.instances.qemu import RECORD, QemuRuntime
from agent.instances.runtime import DomainConfig, RuntimeFailure
from agent.offload import to_thread

GPU0, GPU1 = "0000:18:00.0", "0000:2a:00.0"


def owner(sysfs: Path, group: str) -> tuple[int, int, int]:
    st = (sysfs / "dev" / "vfio" / group).stat()
    return st.st_uid, st.st_gid, st.st_mode & 0o7777


@pytest.fixture
def sysfs(tmp_path: Path) -> Path:
    if os.geteuid() != 0:
        pytest.fail("handing a node to another user needs root (CI runs as root)")
    root = tmp_path / "sys"
    build_tree(root, ["00000000:18:00.0", "00000000:2A:00.0"])
    return root


def runtime(tmp_path: Path, sysfs: Path, running: frozenset[int]) -> QemuRuntime:
    return QemuRuntime(
        tmp_path / "data" / "instances",
        to_thread,
        binary="/bin/true",
        confine=True,
        use_systemd=False,
        vfio_host=FakeVfio(sysfs),
        running_uids=lambda: running,
    )


async def test_a_confined_start_hands_its_groups_to_its_user_and_a_stop_gives_them_back(
    tmp_path: Path, sysfs: Path
) -> None:
    rt = runtime(tmp_path, sysfs, frozenset())
    await rt.define(DomainConfig("a", 1, 256, None, None, "", gpus=(GPU0,)))
    await rt.start("a", paused=False)
    assert owner(sysfs, "0") == (VMM_UID_BASE, VMM_UID_BASE, 0o600) and owner(sysfs, "1") == (0, 0, 0o600)
    await rt.stop("a")
    assert owner(sysfs, "0") == (0, 0, 0o600)
    await rt.start("a", paused=False)
    await rt.delete("a")
    assert owner(sysfs, "0") == (0, 0, 0o600) and not (tmp_path / "data" / "instances" / "a" / RECORD).exists()


async def test_a_group_a_running_vmm_user_holds_fails_the_start_and_changes_nothing(
    tmp_path: Path, sysfs: Path
) -> None:
    other = VMM_UID_BASE + 9
    os.chown(sysfs / "dev" / "vfio" / "0", other, other)
    rt = runtime(tmp_path, sysfs, frozenset({other}))
    await rt.define(DomainConfig("a", 1, 256, None, None, "", gpus=(GPU1, GPU0)))
    with pytest.raises(RuntimeFailure, match=f"^VFIO: VFIO group 0 is held by the running VMM user {other}$"):
        await rt.start("a", paused=False)
    assert owner(sysfs, "0")[0] == other and owner(sysfs, "1") == (0, 0, 0o600)
    await rt.stop("a")  # never gives back another running VMM's group
    assert owner(sysfs, "0")[0] == other


async def test_a_failed_start_gives_the_groups_back(tmp_path: Path, sysfs: Path) -> None:
    rt = runtime(tmp_path, sysfs, frozenset())
    rt.binary = "/bin/false"
    await rt.define(DomainConfig("a", 1, 256, None, None, "", gpus=(GPU0,)))
    with pytest.raises(RuntimeFailure, match="qemu did not start"):
        await rt.start("a", paused=False)
    assert owner(sysfs, "0") == (0, 0, 0o600)


async def test_a_new_domain_takes_the_lowest_vmm_user_no_record_holds_and_no_process_runs_as(
    tmp_path: Path, sysfs: Path
) -> None:
    """Another node's VMs on this host (or a VMM left over) run as VMM users this node has no record of: a
    domain given one of those would be refused at launch (`vm.launch`: runs a process already)."""
    rt = runtime(tmp_path, sysfs, frozenset({VMM_UID_BASE, VMM_UID_BASE + 2}))
    await rt.define(DomainConfig("a", 1, 256, None, None, "", gpus=()))
    await rt.define(DomainConfig("b", 1, 256, None, None, "", gpus=()))
    uids = {iid: json.loads((tmp_path / "data" / "instances" / iid / RECORD).read_text())["uid"] for iid in "ab"}
    assert uids == {"a": VMM_UID_BASE + 1, "b": VMM_UID_BASE + 3}
    rt.running_uids = lambda: frozenset({VMM_UID_BASE + 1})  # its own VMM user, running: a's record keeps it
    await rt.define(DomainConfig("a", 2, 512, None, None, "", gpus=()))
    assert json.loads((tmp_path / "data" / "instances" / "a" / RECORD).read_text())["uid"] == VMM_UID_BASE + 1
