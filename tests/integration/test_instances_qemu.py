"""A real guest under the qemu runtime (TCG), driven by the `instances` converger from spec sections.

The kernel is the host's `linux-image-cloud-amd64`; the initramfs is built here from `busybox-static`
(its /init prints a marker on the serial console and waits; with the host's `qemu_fw_cfg` module it first
prints the user data qemu hands it as fw_cfg `opt/bc/user-data`). qemu daemonizes into its own session and
process group; every qemu this test started is killed by its pid at teardown. In `make test-slow`.
"""

from __future__ import annotations

import os
import signal
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.converge.instances import InstancesConverger
from agent.converge.run import CONVERGED, PROGRESSING
from agent.instances.admission import HostMemory
from agent.instances.qemu import PIDFILE, exited
from agent.instances.user_data import UserDataFiles
from agent.offload import to_thread
from bc.protocol.pb import common_pb2, spec_pb2
from tests.instance_parts import SecretPort, guest
from tests.qemu_guest import GuestHost, boot_dir, guest_host, host_meminfo, newc, vmm_uid

MARKER = "BC-GUEST-UP"
USER_DATA_MARKER = "BC-USER-DATA"
FW_CFG_MODULE = "kernel/drivers/firmware/qemu_fw_cfg.ko"
INIT = f"""#!/bin/busybox sh
/bin/busybox mkdir -p /proc /sys
/bin/busybox mount -t proc proc /proc
/bin/busybox mount -t sysfs sysfs /sys
/bin/busybox insmod /qemu_fw_cfg.ko
f=/sys/firmware/qemu_fw_cfg/by_name/opt/bc/user-data/raw
if [ -e $f ]; then /bin/busybox echo {USER_DATA_MARKER} $(/bin/busybox cat $f); fi
/bin/busybox echo {MARKER} $(/bin/busybox cat /proc/sys/kernel/random/boot_id)
while true; do /bin/busybox sleep 5; done
"""


def fw_cfg_module(vmlinuz: Path) -> bytes:
    """The kernel's qemu_fw_cfg module (built as a module in the cloud kernel), for the guest to insmod."""
    path = Path("/lib/modules") / vmlinuz.name.removeprefix("vmlinuz-") / FW_CFG_MODULE
    if not path.is_file():
        pytest.fail(f"needs {path} (linux-image-cloud-amd64's modules)")
    return path.read_bytes()


class Host(GuestHost):
    def __init__(self, data: Path) -> None:
        def initramfs(vmlinuz: Path) -> bytes:
            dirs = [(d, stat.S_IFDIR | 0o755, b"") for d in ("bin", "proc", "sys")]
            busybox = ("bin/busybox", stat.S_IFREG | 0o755, Path("/usr/bin/busybox").read_bytes())
            init = ("init", stat.S_IFREG | 0o755, INIT.encode())
            module = ("qemu_fw_cfg.ko", stat.S_IFREG | 0o644, fw_cfg_module(vmlinuz))
            return newc([*dirs, busybox, module, init])

        self.boot = boot_dir(data, initramfs)
        self.root = data / "instances"
        self.runtime = self.tcg_runtime()
        self.memory: HostMemory | None = None
        self.port = SecretPort()
        self.user_data = UserDataFiles(data / "run" / "user-data", to_thread)
        self.conv = InstancesConverger(
            {"qemu": self.runtime}, self.boot, self.host_memory, list, to_thread, self.port, self.user_data
        )

    async def host_memory(self) -> HostMemory | None:
        return self.memory or await host_meminfo()

    async def converge(self, *instances: spec_pb2.Instance) -> tuple[int, list[common_pb2.InstanceStatus]]:
        result = await self.conv.converge(spec_pb2.InstancesSection(instances=instances), 1)
        return result.reported_state, list(self.conv.statuses)


@pytest.fixture
def host() -> Iterator[Host]:
    with guest_host(Host) as h:
        yield h


def vm(state: str, memory_mib: int = 256, iid: str = "vm1", user_data: str = "") -> spec_pb2.Instance:
    return guest(iid, memory_mib=memory_mib, state=state, user_data_secret_ref=user_data)


async def test_a_real_guest_runs_pauses_stops_restarts_and_is_deleted(host: Host) -> None:
    state, shown = await host.converge(vm("RUNNING"))
    assert state == CONVERGED and [(s.id, s.state) for s in shown] == [("vm1", "RUNNING")]
    first = await host.console_says("vm1", MARKER)
    pid = host.pid("vm1")
    assert os.getpgid(pid) != os.getpgid(0) and os.getsid(pid) != os.getsid(0)  # its own group and session

    state, shown = await host.converge(vm("PAUSED"))
    assert (state, shown[0].state) == (CONVERGED, "PAUSED")
    assert [(d.id, d.state) for d in await host.runtime.list()] == [("vm1", "PAUSED")]
    state, shown = await host.converge(vm("RUNNING"))
    assert (state, shown[0].state, host.pid("vm1")) == (CONVERGED, "RUNNING", pid)  # a resume, not a boot

    state, shown = await host.converge(vm("STOPPED"))
    assert (state, shown[0].state, await exited(pid, 10.0)) == (CONVERGED, "STOPPED", True)

    # The host "reboots" under a running guest: the next pass boots it again.
    await host.converge(vm("RUNNING"))
    os.kill(pid := host.pid("vm1"), signal.SIGKILL)
    assert await exited(pid, 10.0)
    assert [(d.id, d.state) for d in await host.runtime.list()] == [("vm1", "STOPPED")]
    state, shown = await host.converge(vm("RUNNING"))
    assert (state, shown[0].state) == (CONVERGED, "RUNNING")
    second = await host.console_says("vm1", MARKER)  # qemu's file chardev truncates: this boot's line
    assert host.pid("vm1") != pid and second.split(MARKER)[1].split()[0] != first.split(MARKER)[1].split()[0]

    state, shown = await host.converge(vm("DELETED"))
    assert (state, shown) == (CONVERGED, [])
    assert not (host.root / "vm1").exists()


async def test_admission_refuses_an_oversize_guest_and_a_foreign_directory_is_left_alone(host: Host) -> None:
    total = (await host.host_memory()).total_mib  # type: ignore[union-attr]
    (host.root / "someone-elses").mkdir(parents=True)
    state, shown = await host.converge(vm("RUNNING", memory_mib=total, iid="big"))
    assert state == PROGRESSING
    big, theirs = shown
    assert (big.id, big.state) == ("big", "STOPPED")
    assert big.message.startswith(f"ResourcesExhausted: {total + -(-total // 32) + 256} MiB needed, ")
    assert not (host.root / "big" / PIDFILE).exists()  # no qemu was started
    assert (theirs.id, theirs.managed, theirs.state) == ("someone-elses", False, "STOPPED")
    await host.converge()
    assert (host.root / "someone-elses").is_dir()


async def test_the_guest_reads_its_user_data_from_fw_cfg_and_the_file_goes_at_stop(host: Host) -> None:
    host.port.values["ud"] = b"bc-user-data-0123456789abcdef"
    state, shown = await host.converge(vm("RUNNING", user_data="ud"))
    assert state == CONVERGED and shown[0].state == "RUNNING"
    console = await host.console_says("vm1", MARKER)
    assert f"{USER_DATA_MARKER} bc-user-data-0123456789abcdef" in console
    path = host.user_data.path("vm1")
    # root's, readable by this guest's VMM user alone (its group), and no one else
    info = path.stat()
    assert stat.S_IMODE(info.st_mode) == 0o640 and info.st_uid == 0 and info.st_gid == vmm_uid(host.root, "vm1")
    await host.converge(vm("STOPPED", user_data="ud"))
    assert not path.exists()
    host.port.values["ud"] = b"rotated"  # a rotation reaches the guest at its next start
    await host.converge(vm("RUNNING", user_data="ud"))
    assert f"{USER_DATA_MARKER} rotated" in await host.console_says("vm1", MARKER)
    await host.converge(vm("DELETED", user_data="ud"))
    assert not path.exists()
