"""Placement and ballooning on a real guest (TCG): qemu on its CPUs, its memory bound to a NUMA node, a balloon
the controller inflates and deflates, and guests in huge pages with admission counting the free pages.

The huge page test reserves 2 MiB pages in the host's pool and gives them back at teardown (it runs as root,
as CI does). In `make test-slow`.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.converge.instances import InstancesConverger
from agent.converge.run import PROGRESSING
from agent.instances.balloon import HostPressure
from agent.instances.balloon_control import BalloonController
from agent.instances.placement import HostTopology, read_topology
from agent.offload import to_thread
from bc.protocol.pb import common_pb2, spec_pb2
from tests.instance_parts import guest
from tests.qemu_guest import LOAD_MODULES, GuestHost, boot_dir, guest_host, host_meminfo, initrd

pytestmark = pytest.mark.slow

MARKER = "BC-GUEST-UP"
INIT = f"""#!/bin/busybox sh
/bin/busybox mkdir -p /proc /sys
/bin/busybox mount -t proc proc /proc
/bin/busybox mount -t sysfs sysfs /sys
{LOAD_MODULES}
/bin/busybox echo {MARKER}
while true; do /bin/busybox sleep 5; done
"""
HUGE_POOL = Path("/sys/kernel/mm/hugepages/hugepages-2048kB")


class Host(GuestHost):
    def __init__(self, data: Path) -> None:
        self.boot = boot_dir(data, lambda vmlinuz: initrd(INIT, vmlinuz, ("virtio_pci", "virtio_balloon")))
        self.root = data / "instances"
        self.runtime = self.tcg_runtime()
        self.conv = InstancesConverger(
            {"qemu": self.runtime}, self.boot, host_meminfo, list, to_thread, topology=self.topology
        )

    async def topology(self) -> HostTopology:
        return await to_thread(read_topology)

    async def converge(self, *instances: spec_pb2.Instance) -> tuple[int, dict[str, common_pb2.InstanceStatus]]:
        result = await self.conv.converge(spec_pb2.InstancesSection(instances=instances), 1)
        return result.reported_state, {s.id: s for s in self.conv.statuses}


@pytest.fixture
def host() -> Iterator[Host]:
    with guest_host(Host) as h:
        yield h


def vm(iid: str, memory_mib: int = 256, **placement: object) -> spec_pb2.Instance:
    inst = guest(iid, memory_mib=memory_mib)
    inst.placement.CopyFrom(spec_pb2.Placement(**placement))  # type: ignore[arg-type]
    return inst


async def test_a_guest_on_its_cpu_with_bound_memory_and_a_balloon_the_controller_moves(host: Host) -> None:
    _, shown = await host.converge(vm("b1", cpus="0", mems="0", balloon=True))
    assert shown["b1"].state == "RUNNING", shown["b1"].message
    await host.console_says("b1", MARKER)
    pid = host.pid("b1")
    for task in Path(f"/proc/{pid}/task").iterdir():  # every thread, the vCPU's included, on CPU 0
        status = (task / "status").read_text()
        assert "Cpus_allowed_list:\t0\n" in status, status
    assert (await host.runtime.balloon("b1")).actual_mib == 256

    pressure = HostPressure(100_000, 50_000)

    async def read() -> HostPressure:
        return pressure

    ctl = BalloonController({"qemu": host.runtime}, host.conv.ballooned, read, 50, reclaimed=host.conv.balloon_mib)
    pressure = HostPressure(100_000, 0)  # no memory left on the "host": inflate
    async with asyncio.timeout(60):  # the guest's driver reports its use every 2 s once polling is on
        while not (moves := await ctl.once()):
            await asyncio.sleep(0.5)
    assert moves == {"b1": 192}  # a quarter of 256 MiB per pass, above the floor
    async with asyncio.timeout(60):  # the guest's driver inflates it
        while (await host.runtime.balloon("b1")).actual_mib != 192:
            await asyncio.sleep(0.2)
    assert ctl.reclaimed == {"b1": 64}
    _, shown = await host.converge(vm("b1", cpus="0", mems="0", balloon=True))
    assert shown["b1"].balloon_mib == 64
    pressure = HostPressure(100_000, 90_000)  # plenty again: deflate a step
    assert await ctl.once() == {"b1": 256}
    async with asyncio.timeout(60):
        while (await host.runtime.balloon("b1")).actual_mib != 256:
            await asyncio.sleep(0.2)


async def test_a_guest_without_a_balloon_is_never_touched(host: Host) -> None:
    _, shown = await host.converge(vm("plain"))
    assert shown["plain"].state == "RUNNING"

    async def read() -> HostPressure:
        return HostPressure(100_000, 0)

    ctl = BalloonController({"qemu": host.runtime}, lambda: [("qemu", "plain", 256)], read)
    assert await ctl.once() == {} and ctl.reclaimed == {}


@pytest.fixture
def huge_pages() -> Iterator[None]:
    """96 more 2 MiB pages in the host's pool, given back after."""
    if os.geteuid() != 0:
        pytest.fail("the huge page test reserves host huge pages: it runs as root (CI does)")
    before = int((HUGE_POOL / "nr_hugepages").read_text())
    (HUGE_POOL / "nr_hugepages").write_text(str(before + 96))
    try:
        if int((HUGE_POOL / "free_hugepages").read_text()) < 96:
            pytest.fail("the host could not set aside 96 free 2 MiB pages")
        yield
    finally:
        (HUGE_POOL / "nr_hugepages").write_text(str(before))


async def test_guests_in_huge_pages_and_admission_counting_the_free_pages(huge_pages: None, host: Host) -> None:
    # huge_pages first: set up before the host, so given back after its guests are killed
    free_before = int((HUGE_POOL / "free_hugepages").read_text())
    a = vm("h1", 128, mems="0", hugepage_mib=2)
    _, shown = await host.converge(a)
    assert shown["h1"].state == "RUNNING", shown["h1"].message
    await host.console_says("h1", MARKER)
    assert int((HUGE_POOL / "free_hugepages").read_text()) == free_before - 64  # preallocated: all of it
    maps = Path(f"/proc/{host.pid('h1')}/maps").read_text()
    assert "/memfd:bc-mem (deleted)" in maps or "memfd:" in maps, maps
    # 96 - 64 = 32 pages left: a second 128 MiB guest does not fit and stays stopped
    state, shown = await host.converge(a, vm("h2", 128, hugepage_mib=2))
    assert state == PROGRESSING
    assert shown["h2"].state == "STOPPED"
    assert shown["h2"].message.startswith("ResourcesExhausted: 64 huge pages of 2 MiB needed, ")
    assert shown["h1"].state == "RUNNING"
    # the first one's stop gives its pages back, and the next pass starts the second
    stop = vm("h1", 128, mems="0", hugepage_mib=2)
    stop.state = "STOPPED"
    state, shown = await host.converge(stop, vm("h2", 128, hugepage_mib=2))
    assert shown["h1"].state == "STOPPED" and shown["h2"].state == "RUNNING", shown["h2"].message
