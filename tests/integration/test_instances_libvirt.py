"""A real guest under the libvirt runtime, driven by the `instances` converger against a real libvirtd.

The test starts its own libvirtd as root in a private mount namespace (`unshare -m`): tmp directories are
bound over /etc/libvirt (its own libvirtd.conf and qemu.conf), /var/lib/libvirt, /var/cache/libvirt,
/var/log/libvirt and /run, so the daemon writes nothing outside the test's tmp dir, and its sockets are in
a tmp directory the test connects to (`qemu:///system?socket=…`). It tells the test it is ready over
NOTIFY_SOCKET (sd_notify READY=1), as it would tell systemd. qemu.conf keeps libvirt's stock qemu user
(`libvirt-qemu`) and dynamic ownership, so the runtime must open search on bc's 0700 data directory for it,
and turns off cgroups, namespaces and the security driver (none of which this machine offers a daemon
outside systemd). The domain type is `qemu` (TCG). The guest is the busybox one of tests/qemu_guest.py.
In `make test-slow`.
"""

from __future__ import annotations

import asyncio
import os
import pwd
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any
from xml.etree import ElementTree as ET

import pytest

from agent.converge.instances import InstancesConverger
from agent.converge.run import CONVERGED, FAILED, PROGRESSING
from agent.instances.admission import HostMemory, parse_meminfo
from agent.instances.balloon import HostPressure
from agent.instances.balloon_control import BalloonController
from agent.instances.libvirt import LibvirtRuntime, load, open_runtime
from agent.instances.libvirt_xml import CONSOLE, NAMESPACE, read_domain
from agent.instances.placement import read_topology
from agent.instances.runtime import NoBalloon, RuntimeFailure, VolumeConfig
from agent.instances.user_data import UserDataFiles
from agent.offload import to_thread
from bc.protocol.pb import common_pb2, spec_pb2
from tests import qemu_guest

pytestmark = pytest.mark.slow

MARKER = "BC-GUEST-UP"
USER_DATA_MARKER = "BC-USER-DATA"
INIT = f"""#!/bin/busybox sh
/bin/busybox mount -t proc proc /proc
/bin/busybox mount -t sysfs sysfs /sys
{qemu_guest.LOAD_MODULES}
f=/sys/firmware/qemu_fw_cfg/by_name/opt/bc/user-data/raw
if [ -e $f ]; then /bin/busybox echo {USER_DATA_MARKER} $(/bin/busybox cat $f); fi
/bin/busybox echo {MARKER} $(/bin/busybox cat /proc/sys/kernel/random/boot_id)
while true; do /bin/busybox sleep 5; done
"""
BINDS = (("etc", "/etc/libvirt"), ("lib", "/var/lib/libvirt"), ("cache", "/var/cache/libvirt"))
BINDS += (("log", "/var/log/libvirt"), ("run", "/run"))
QEMU_CONF = """security_driver = "none"
cgroup_controllers = [ ]
namespaces = [ ]
stdio_handler = "file"
"""


class Daemon:
    """One libvirtd of the test's own (see the module's docstring)."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.sockets = base / "sock"
        self.proc: subprocess.Popen[bytes] | None = None
        for d in ("sock", *(b for b, _ in BINDS)):
            (base / d).mkdir(parents=True, exist_ok=True)
        (base / "etc" / "libvirtd.conf").write_text(
            f'unix_sock_dir = "{self.sockets}"\nunix_sock_rw_perms = "0700"\nauth_unix_rw = "none"\n'
            f'auth_unix_ro = "none"\nlog_outputs = "3:file:/var/log/libvirt/libvirtd.log"\n'
        )
        (base / "etc" / "qemu.conf").write_text(QEMU_CONF)

    @property
    def uri(self) -> str:
        return f"qemu:///system?socket={self.sockets / 'libvirt-sock'}"

    async def start(self) -> None:
        if shutil.which("libvirtd") is None and not Path("/usr/sbin/libvirtd").exists():
            pytest.fail("needs libvirtd (libvirt-daemon-system, libvirt-daemon-driver-qemu: .ci/run installs them)")
        mounts = " && ".join(f"mount --bind {self.base / b} {target}" for b, target in BINDS)
        notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        notify.bind(str(self.base / "notify"))
        notify.setblocking(False)
        env = dict(os.environ, NOTIFY_SOCKET=str(self.base / "notify"), PATH=os.environ["PATH"] + ":/usr/sbin")
        self.proc = subprocess.Popen(
            ["unshare", "-m", "--propagation", "private", "sh", "-c", f"{mounts} && exec libvirtd"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=open(self.base / "libvirtd.stderr", "wb"),  # noqa: SIM115 - the child holds it
        )
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(30):
                while b"READY=1" not in await loop.sock_recv(notify, 4096):
                    pass
        except TimeoutError:
            raise AssertionError(
                f"libvirtd did not say READY=1: {(self.base / 'libvirtd.stderr').read_text(errors='replace')}"
            ) from None
        finally:
            notify.close()
            (self.base / "notify").unlink()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def kill_guests(self) -> None:
        """What libvirtd started outlives it: every qemu of this daemon, by its pid file."""
        for pidfile in (self.base / "run" / "libvirt" / "qemu").glob("*.pid"):
            try:
                os.kill(int(pidfile.read_text()), signal.SIGKILL)
            except (OSError, ValueError):
                pass

    def qemu_pid(self, name: str) -> int:
        return int((self.base / "run" / "libvirt" / "qemu" / f"{name}.pid").read_text())


class Host:
    def __init__(self, data: Path, daemon: Daemon) -> None:
        self.daemon = daemon
        self.boot = data / "instance-boot"
        self.boot.mkdir(mode=0o700)
        vmlinuz = qemu_guest.kernel()
        shutil.copy(vmlinuz, self.boot / "vmlinuz")
        modules = ("qemu_fw_cfg", "virtio_pci", "virtio_balloon")
        (self.boot / "initrd").write_bytes(qemu_guest.initrd(INIT, vmlinuz, modules))
        self.root = data / "libvirt"
        module = load()
        if module is None:
            pytest.fail("needs libvirt-python (make venv installs it where pkg-config finds libvirt-dev)")
        self.lv: Any = module
        self.runtime = LibvirtRuntime(module, daemon.uri, self.root, to_thread, domain_type="qemu", stop_grace_s=1.0)
        self.values: dict[str, bytes] = {}
        self.user_data = UserDataFiles(data / "run" / "user-data", to_thread)
        self.conv = InstancesConverger(
            {"libvirt": self.runtime}, self.boot, self.host_memory, list, to_thread, self, self.user_data,
            topology=lambda: to_thread(read_topology),
        )  # fmt: skip

    # the secret port, as the converger asks it (the broker is tested in test_instances_user_data.py)
    async def get(self, name: str, section: str, generation: int, unit: str = "", allocation_id: str = "") -> bytes:
        return self.values[name]

    def release(self, section: str, unit: str = "") -> None:
        pass

    async def host_memory(self) -> HostMemory | None:
        return parse_meminfo(await to_thread(Path("/proc/meminfo").read_text))

    async def converge(self, *instances: spec_pb2.Instance) -> tuple[int, list[common_pb2.InstanceStatus]]:
        result = await self.conv.converge(spec_pb2.InstancesSection(instances=instances), 1)
        return result.reported_state, list(self.conv.statuses)

    async def console_says(self, iid: str, text: str, within_s: float = 120.0) -> str:
        """The console once it holds `text` (a boot under TCG takes seconds): re-read until the deadline."""
        path = self.root / iid / CONSOLE
        async with asyncio.timeout(within_s):
            while True:
                got = path.read_text(errors="replace") if path.exists() else ""
                if text in got:
                    return got
                await asyncio.sleep(0.2)

    def connect(self) -> Any:
        return self.lv.open(self.daemon.uri)


@pytest.fixture
def base() -> Iterator[Path]:
    """A tmp directory others may search (pytest's own are 0700 root): qemu runs as libvirt's user."""
    path = Path(tempfile.mkdtemp(prefix="bc-libvirt-"))
    os.chmod(path, 0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def daemon(base: Path) -> Iterator[Daemon]:
    d = Daemon(base / "libvirtd")
    try:
        yield d
    finally:
        d.stop()
        d.kill_guests()


@pytest.fixture
async def host(base: Path, daemon: Daemon) -> AsyncIterator[Host]:
    await daemon.start()
    data = base / "d"
    data.mkdir(mode=0o700)  # bc's data directory is root's; the runtime opens search on the way to the files
    h = Host(data, daemon)
    try:
        yield h
    finally:
        try:
            conn = h.connect()
            for dom in conn.listAllDomains(0):
                if dom.isActive():
                    dom.destroy()
            conn.close()
        except h.lv.libvirtError:
            pass


def vm(
    state: str, memory_mib: int = 256, iid: str = "vm1", user_data: str = "", **placement: object
) -> spec_pb2.Instance:
    inst = spec_pb2.Instance(
        id=iid, runtime="libvirt", vcpus=1, memory_mib=memory_mib, kernel="vmlinuz", initrd="initrd",
        cmdline="console=ttyS0 quiet panic=-1", state=state, user_data_secret_ref=user_data,
    )  # fmt: skip
    if placement:
        inst.placement.CopyFrom(spec_pb2.Placement(**placement))  # type: ignore[arg-type]
    return inst


def boot_id(console: str) -> str:
    return console.split(MARKER)[1].split()[0]


async def test_a_real_guest_under_libvirt_runs_pauses_stops_restarts_and_is_deleted(host: Host) -> None:
    host.values["ud"] = b"bc-user-data-via-libvirt"
    state, shown = await host.converge(vm("RUNNING", user_data="ud"))
    assert state == CONVERGED and [(s.id, s.runtime, s.state) for s in shown] == [("vm1", "libvirt", "RUNNING")]
    first = await host.console_says("vm1", MARKER)
    assert f"{USER_DATA_MARKER} bc-user-data-via-libvirt" in first  # fw_cfg opt/bc/user-data, via <sysinfo>
    pid = host.daemon.qemu_pid("vm1")
    uid = next(
        line.split()[1] for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("Uid:")
    )
    assert int(uid) == pwd.getpwnam("libvirt-qemu").pw_uid  # libvirt's stock qemu user, not root
    data = host.boot.parent
    assert [stat.S_IMODE(d.stat().st_mode) for d in (data, host.boot)] == [0o701, 0o701]  # search only, no listing
    dom = host.connect().lookupByName("vm1")
    assert dom.metadata(host.lv.VIR_DOMAIN_METADATA_ELEMENT, NAMESPACE).startswith("<instance")  # bc's mark

    state, shown = await host.converge(vm("PAUSED", user_data="ud"))
    assert (state, shown[0].state, dom.state()[0]) == (CONVERGED, "PAUSED", host.lv.VIR_DOMAIN_PAUSED)
    state, shown = await host.converge(vm("RUNNING", user_data="ud"))
    assert (state, shown[0].state, host.daemon.qemu_pid("vm1")) == (CONVERGED, "RUNNING", pid)  # resumed, not booted

    # busybox ignores the power button: the stop destroys it once the grace (1 s here) has passed
    state, shown = await host.converge(vm("STOPPED", user_data="ud"))
    assert (state, shown[0].state, dom.isActive()) == (CONVERGED, "STOPPED", 0)
    assert not host.user_data.path("vm1").exists()  # the user data file went with the stop
    assert [(d.id, d.state, d.managed) for d in await host.runtime.list()] == [("vm1", "STOPPED", True)]

    host.values["ud"] = b"rotated"
    state, shown = await host.converge(vm("RUNNING", user_data="ud"))
    assert (state, shown[0].state) == (CONVERGED, "RUNNING")
    second = await host.console_says("vm1", MARKER)  # the console file holds this boot only
    assert f"{USER_DATA_MARKER} rotated" in second and boot_id(second) != boot_id(first)
    assert host.daemon.qemu_pid("vm1") != pid

    # a volume attached live, grown, detached; the persistent definition follows (the next boot has it)
    vol = host.boot.parent / "volumes" / "v1.raw"
    vol.parent.mkdir(mode=0o700)
    vol.write_bytes(b"")
    os.truncate(vol, 8 << 20)
    await host.runtime.attach_volume("vm1", VolumeConfig("v1", vol, "bc-v1"))
    live = ET.fromstring(dom.XMLDesc(0))
    assert [(d.findtext("serial"), d.find("target").get("dev")) for d in live.iterfind("devices/disk")] == [  # type: ignore[union-attr]
        ("bc-v1", "vda")
    ]
    assert read_domain(dom.XMLDesc(host.lv.VIR_DOMAIN_XML_INACTIVE)).config.volumes == (  # type: ignore[union-attr]
        VolumeConfig("v1", vol, "bc-v1"),
    )
    os.truncate(vol, 16 << 20)
    await host.runtime.resize_volume("vm1", "v1", 16 << 20)
    assert dom.blockInfo(str(vol))[0] == 16 << 20  # the capacity qemu now gives the guest
    await host.runtime.detach_volume("vm1", "v1")
    assert ET.fromstring(dom.XMLDesc(0)).find("devices/disk") is None
    assert read_domain(dom.XMLDesc(host.lv.VIR_DOMAIN_XML_INACTIVE)).config.volumes == ()  # type: ignore[union-attr]

    state, shown = await host.converge(vm("DELETED"))
    assert (state, shown) == (CONVERGED, [])
    assert host.connect().listAllDomains(0) == [] and not (host.root / "vm1").exists()


FOREIGN = """<domain type='qemu'><name>legacy</name><memory unit='MiB'>64</memory><vcpu>1</vcpu>
<os><type arch='x86_64'>hvm</type></os><devices><memballoon model='none'/></devices></domain>"""


async def test_a_foreign_domain_is_left_alone_and_admission_refuses_an_oversize_guest(host: Host) -> None:
    conn = host.connect()
    conn.defineXML(FOREIGN)  # defined directly with libvirt, as an operator would
    state, shown = await host.converge(vm("RUNNING", iid="legacy"))
    assert state == FAILED
    assert [(s.id, s.state, s.managed, s.message) for s in shown] == [
        ("legacy", "ERROR", True, "a domain bc did not create is named legacy (runtime libvirt); it is left alone"),
        ("legacy", "STOPPED", False, ""),
    ]
    total = (await host.host_memory()).total_mib  # type: ignore[union-attr]
    state, shown = await host.converge(vm("RUNNING", memory_mib=total, iid="big"))
    assert state == PROGRESSING
    big, theirs = shown
    assert (big.id, big.state) == ("big", "STOPPED")
    assert big.message.startswith(f"ResourcesExhausted: {total + -(-total // 32) + 256} MiB needed, ")
    assert not conn.lookupByName("big").isActive()  # defined, never started
    assert (theirs.id, theirs.managed, theirs.memory_mib) == ("legacy", False, 64)
    for call in (host.runtime.stop, host.runtime.delete, host.runtime.pause):  # the runtime itself refuses too
        with pytest.raises(RuntimeFailure, match="domain legacy is not bc's; it is left alone"):
            await call("legacy")
    state, shown = await host.converge()  # no spec names it: bc's "big" is deleted, "legacy" stays
    assert (state, [(s.id, s.managed) for s in shown]) == (CONVERGED, [("legacy", False)])
    assert [d.name() for d in conn.listAllDomains(0)] == ["legacy"]


async def test_the_runtime_reconnects_when_libvirtd_restarts_and_finds_its_guest_running(host: Host) -> None:
    state, _ = await host.converge(vm("RUNNING"))
    assert state == CONVERGED
    await host.console_says("vm1", MARKER)
    pid = host.daemon.qemu_pid("vm1")
    host.daemon.stop()
    # the connection is gone: the pass does nothing on a guess
    result = await host.conv.converge(spec_pb2.InstancesSection(instances=[vm("RUNNING")]), 1)
    assert (result.state, result.reason) == (FAILED, "RuntimeUnavailable")
    assert "runtime libvirt: cannot connect to libvirt at qemu:///system?socket=" in result.message
    assert not host.conv.complete
    await host.daemon.start()
    state, shown = await host.converge(vm("RUNNING"))
    assert (state, shown[0].state, host.daemon.qemu_pid("vm1")) == (CONVERGED, "RUNNING", pid)
    # a restart between two passes: the listing finds its connection dead, opens a new one and carries on
    host.daemon.stop()
    await host.daemon.start()
    state, shown = await host.converge(vm("RUNNING"))
    assert (state, shown[0].state, host.daemon.qemu_pid("vm1")) == (CONVERGED, "RUNNING", pid)


def test_a_start_libvirt_refuses_for_memory_is_a_capacity_failure(tmp_path: Path) -> None:
    module = load()
    assert module is not None
    rt = LibvirtRuntime(module, "test:///default", tmp_path, to_thread)  # libvirt's own in-process test driver

    def refused(_conn: Any) -> None:
        raise module.libvirtError("internal error: qemu unexpectedly closed the monitor: Cannot allocate memory")

    with pytest.raises(RuntimeFailure, match="Cannot allocate memory") as e:
        rt._call(refused)
    assert e.value.capacity


def test_a_uri_that_does_not_answer_means_no_libvirt_runtime(tmp_path: Path) -> None:
    assert load() is not None  # make venv installed libvirt-python: this host has libvirt-dev
    uri = f"qemu:///system?socket={tmp_path / 'nobody-listens'}"
    assert open_runtime(tmp_path / "libvirt", to_thread, uri, ("tcg",)) is None
    assert open_runtime(tmp_path / "libvirt", to_thread, "", ("tcg",)) is None


async def test_a_placed_guest_runs_on_its_cpu_and_its_balloon_moves_a_plain_one_has_none(host: Host) -> None:
    placed = vm("RUNNING", iid="b1", cpus="0", mems="0", balloon=True)
    state, shown = await host.converge(placed, vm("RUNNING", iid="plain"))
    assert state == CONVERGED, [s.message for s in shown]
    await host.console_says("b1", MARKER)
    pid = host.daemon.qemu_pid("b1")
    for task in Path(f"/proc/{pid}/task").iterdir():  # every thread of its qemu, the vCPU's included, on CPU 0
        status = (task / "status").read_text()
        assert "Cpus_allowed_list:\t0\n" in status, status
    assert (await host.runtime.balloon("b1")).actual_mib == 256
    with pytest.raises(NoBalloon, match="domain plain has no balloon device"):
        await host.runtime.balloon("plain")
    with pytest.raises(NoBalloon):
        await host.runtime.set_balloon("plain", 128)

    pressure = HostPressure(100_000, 0)  # no memory left on the "host": inflate

    async def read() -> HostPressure:
        return pressure

    ctl = BalloonController({"libvirt": host.runtime}, host.conv.ballooned, read, 50, reclaimed=host.conv.balloon_mib)
    async with asyncio.timeout(60):  # the guest's driver reports its use every 2 s (<stats period='2'/>)
        while not (moves := await ctl.once()):
            await asyncio.sleep(0.5)
    assert moves == {"b1": 192}  # a quarter of 256 MiB per pass, above the floor; "plain" is never touched
    async with asyncio.timeout(60):  # the guest's driver inflates it
        while (await host.runtime.balloon("b1")).actual_mib != 192:
            await asyncio.sleep(0.2)
    _, shown = await host.converge(placed, vm("RUNNING", iid="plain"))
    assert {s.id: s.balloon_mib for s in shown} == {"b1": 64, "plain": 0}
    pressure = HostPressure(100_000, 90_000)  # plenty again: deflate a step
    assert await ctl.once() == {"b1": 256}
    async with asyncio.timeout(60):
        while (await host.runtime.balloon("b1")).actual_mib != 256:
            await asyncio.sleep(0.2)
