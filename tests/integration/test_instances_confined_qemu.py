"""Each VMM as its own user (agent.instances.confine), on real guests (TCG): the uids, what each VMM may
open, and that it cannot reach another's files or replace root's. In `make test-slow`."""

from __future__ import annotations

import os
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.converge.instances import InstancesConverger
from agent.instances.qemu import PIDFILE, RECORD
from agent.offload import to_thread
from bc.protocol.pb import common_pb2, spec_pb2
from tests.instance_parts import guest
from tests.qemu_guest import GuestHost, boot_dir, guest_host, host_meminfo, initrd, vmm_uid

pytestmark = pytest.mark.slow

MARKER = "BC-GUEST-UP"
INIT = f"""#!/bin/busybox sh
/bin/busybox echo {MARKER}
while true; do /bin/busybox sleep 5; done
"""


class Host(GuestHost):
    def __init__(self, data: Path) -> None:
        self.boot = boot_dir(data, lambda vmlinuz: initrd(INIT, vmlinuz))
        for f in self.boot.iterdir():
            f.chmod(0o644)
        self.root = data / "instances"
        self.runtime = self.tcg_runtime(confine=True)
        self.conv = InstancesConverger({"qemu": self.runtime}, self.boot, host_meminfo, list, to_thread)

    async def converge(self, *instances: spec_pb2.Instance) -> dict[str, common_pb2.InstanceStatus]:
        await self.conv.converge(spec_pb2.InstancesSection(instances=instances), 1)
        return {s.id: s for s in self.conv.statuses}


@pytest.fixture
def host() -> Iterator[Host]:
    if os.geteuid() != 0:
        pytest.fail("starting a VMM as another user needs root (CI runs as root)")
    with guest_host(Host) as h:
        yield h


def vm(iid: str, state: str = "RUNNING") -> spec_pb2.Instance:
    return guest(iid, state=state)


def ids(pid: int) -> tuple[list[str], list[str], str]:
    """Uid and Gid lines (real, effective, saved, fs) and Groups of a process."""
    lines = {
        k: v.split() for k, _, v in (ln.partition(":") for ln in Path(f"/proc/{pid}/status").read_text().splitlines())
    }
    return lines["Uid"], lines["Gid"], " ".join(lines.get("Groups", []))


def as_user(uid: int, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, user=uid, group=uid, extra_groups=[], capture_output=True, text=True, check=False)


async def test_each_vmm_runs_as_its_own_user_and_reaches_only_its_own_files(host: Host) -> None:
    shown = await host.converge(vm("a"), vm("b"))
    assert shown["a"].state == "RUNNING" and shown["b"].state == "RUNNING", (shown["a"].message, shown["b"].message)
    await host.console_says("a", MARKER)
    uid_a, uid_b = vmm_uid(host.root, "a"), vmm_uid(host.root, "b")
    assert uid_a != uid_b
    for iid, uid in (("a", uid_a), ("b", uid_b)):
        u, g, groups = ids(host.pid(iid))
        assert u == [str(uid)] * 4 and g == [str(uid)] * 4, (u, g)
        assert set(groups.split()) <= {str(uid), *([] if not groups else groups.split())}
        d = host.root / iid
        info = d.stat()
        assert (stat.S_IMODE(info.st_mode), info.st_uid, info.st_gid) == (0o1770, 0, uid)
        record = (d / RECORD).stat()
        assert (stat.S_IMODE(record.st_mode), record.st_uid) == (0o600, 0)
    # a's VMM user: cannot list or read b's directory, cannot read or replace root's record in its own
    assert as_user(uid_a, "ls", str(host.root / "b")).returncode != 0
    assert as_user(uid_a, "cat", str(host.root / "b" / RECORD)).returncode != 0
    assert as_user(uid_a, "cat", str(host.root / "a" / RECORD)).returncode != 0
    moved = as_user(uid_a, "mv", str(host.root / "a" / RECORD), str(host.root / "a" / "stolen"))
    assert moved.returncode != 0 and "not permitted" in moved.stderr, moved.stderr
    assert as_user(uid_a, "ls", str(host.root)).returncode != 0  # search, never list
    # a stop and a start keep its user
    await host.converge(vm("a", "STOPPED"), vm("b"))
    shown = await host.converge(vm("a"), vm("b"))
    assert shown["a"].state == "RUNNING"
    assert ids(host.pid("a"))[0] == [str(uid_a)] * 4


async def test_a_shared_boot_file_others_cannot_read_fails_the_start_with_a_sentence(host: Host) -> None:
    (host.boot / "initrd").chmod(0o600)
    shown = await host.converge(vm("a"))
    assert shown["a"].state == "ERROR"
    assert shown["a"].message == (
        f"start: cannot let its VMM user reach its files: {host.boot / 'initrd'} is not readable by others,"
        " and a confined VMM must read it"
    )
    assert not (host.root / "a" / PIDFILE).exists()
