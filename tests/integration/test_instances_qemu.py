"""A real guest under the qemu runtime (TCG), driven by the `instances` converger from spec sections.

The kernel is the host's `linux-image-cloud-amd64`; the initramfs is built here from `busybox-static`
(its /init prints a marker on the serial console and waits; with the host's `qemu_fw_cfg` module it first
prints the user data qemu hands it as fw_cfg `opt/bc/user-data`). qemu daemonizes into its own session and
process group; every qemu this test started is killed by its pid at teardown. In `make test-slow`.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import stat
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agent.converge.instances import InstancesConverger
from agent.converge.run import CONVERGED, PROGRESSING
from agent.instances.admission import HostMemory, parse_meminfo
from agent.instances.qemu import CONSOLE, PIDFILE, QemuRuntime, exited
from agent.instances.user_data import UserDataFiles
from agent.offload import to_thread
from bc.protocol.pb import common_pb2, spec_pb2

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


def newc(entries: list[tuple[str, int, bytes]]) -> bytes:
    """A cpio archive in the kernel's `newc` format: (name, mode, data) entries, then the trailer."""
    out = bytearray()
    for ino, (name, mode, data) in enumerate([*entries, ("TRAILER!!!", 0, b"")], start=1):
        raw = name.encode() + b"\0"
        fields = [ino, mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(raw), 0]
        out += b"070701" + b"".join(b"%08x" % f for f in fields) + raw
        out += b"\0" * (-len(out) % 4) + data
        out += b"\0" * (-len(out) % 4)
    return bytes(out)


def kernel() -> Path:
    found = sorted(Path("/boot").glob("vmlinuz-*-cloud-amd64"))
    if not found or shutil.which("qemu-system-x86_64") is None or not Path("/usr/bin/busybox").exists():
        pytest.fail("needs qemu-system-x86, busybox-static and linux-image-cloud-amd64 (.ci/run installs them)")
    return found[-1]


def fw_cfg_module(vmlinuz: Path) -> bytes:
    """The kernel's qemu_fw_cfg module (built as a module in the cloud kernel), for the guest to insmod."""
    path = Path("/lib/modules") / vmlinuz.name.removeprefix("vmlinuz-") / FW_CFG_MODULE
    if not path.is_file():
        pytest.fail(f"needs {path} (linux-image-cloud-amd64's modules)")
    return path.read_bytes()


class Port:
    """The broker's answer, as the secret port hands it to the converger (the broker itself is tested on
    a real control plane in tests/integration/test_instances_user_data.py)."""

    def __init__(self) -> None:
        self.values: dict[str, bytes] = {}

    async def get(self, name: str, section: str, generation: int, unit: str = "", allocation_id: str = "") -> bytes:
        return self.values[name]

    def release(self, section: str, unit: str = "") -> None:
        pass


class Host:
    def __init__(self, data: Path) -> None:
        self.boot = data / "instance-boot"
        self.boot.mkdir(parents=True)
        vmlinuz = kernel()
        shutil.copy(vmlinuz, self.boot / "vmlinuz")
        dirs = [(d, stat.S_IFDIR | 0o755, b"") for d in ("bin", "proc", "sys")]
        busybox = ("bin/busybox", stat.S_IFREG | 0o755, Path("/usr/bin/busybox").read_bytes())
        init = ("init", stat.S_IFREG | 0o755, INIT.encode())
        module = ("qemu_fw_cfg.ko", stat.S_IFREG | 0o644, fw_cfg_module(vmlinuz))
        (self.boot / "initrd").write_bytes(newc([*dirs, busybox, module, init]))
        self.root = data / "instances"
        self.runtime = QemuRuntime(self.root, to_thread, accel=("tcg",), stop_grace_s=1.0)
        self.memory: HostMemory | None = None
        self.port = Port()
        self.user_data = UserDataFiles(data / "run" / "user-data", to_thread)
        self.conv = InstancesConverger(
            {"qemu": self.runtime}, self.boot, self.host_memory, list, to_thread, self.port, self.user_data
        )

    async def host_memory(self) -> HostMemory | None:
        return self.memory or parse_meminfo(await to_thread(Path("/proc/meminfo").read_text))

    async def converge(self, *instances: spec_pb2.Instance) -> tuple[int, list[common_pb2.InstanceStatus]]:
        result = await self.conv.converge(spec_pb2.InstancesSection(instances=instances), 1)
        return result.reported_state, list(self.conv.statuses)

    def pid(self, iid: str) -> int:
        return int((self.root / iid / PIDFILE).read_text())

    async def console_says(self, iid: str, text: str, within_s: float = 90.0) -> str:
        """The console once it holds `text` (a boot under TCG takes a few seconds): re-read until the deadline."""
        path = self.root / iid / CONSOLE
        async with asyncio.timeout(within_s):
            while True:
                got = path.read_text(errors="replace") if path.exists() else ""
                if text in got:
                    return got
                await asyncio.sleep(0.2)

    def kill_all(self) -> None:
        for pidfile in self.root.glob(f"*/{PIDFILE}"):
            try:
                os.kill(int(pidfile.read_text()), signal.SIGKILL)
            except (OSError, ValueError):
                pass


@pytest.fixture
async def host(tmp_path: Path) -> AsyncIterator[Host]:
    h = Host(tmp_path / "d")
    try:
        yield h
    finally:
        h.kill_all()


def vm(state: str, memory_mib: int = 256, iid: str = "vm1", user_data: str = "") -> spec_pb2.Instance:
    return spec_pb2.Instance(
        id=iid, runtime="qemu", vcpus=1, memory_mib=memory_mib, kernel="vmlinuz", initrd="initrd",
        cmdline="console=ttyS0 quiet panic=-1", state=state, user_data_secret_ref=user_data,
    )  # fmt: skip


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
    assert path.exists() and stat.S_IMODE(path.stat().st_mode) == 0o600
    await host.converge(vm("STOPPED", user_data="ud"))
    assert not path.exists()
    host.port.values["ud"] = b"rotated"  # a rotation reaches the guest at its next start
    await host.converge(vm("RUNNING", user_data="ud"))
    assert f"{USER_DATA_MARKER} rotated" in await host.console_says("vm1", MARKER)
    await host.converge(vm("DELETED", user_data="ud"))
    assert not path.exists()
