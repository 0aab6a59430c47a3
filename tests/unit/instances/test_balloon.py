"""Memory ballooning: the policy's table, its bounds (Hypothesis), and the controller over the fake runtime."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.converge.instances import InstancesConverger
from agent.instances.admission import HostMemory
from agent.instances.balloon import BalloonGuest, HostPressure, floor_mib, parse_pressure, plan
from agent.instances.balloon_control import BalloonController
from agent.instances.fake import FakeRuntime
from agent.offload import inline
from bc.protocol.pb import spec_pb2

TOTAL = 100_000  # MiB: percentages read off directly


def guest(iid: str, memory: int = 8000, actual: int | None = None, used: int | None = 1000) -> BalloonGuest:
    return BalloonGuest(iid, memory, memory if actual is None else actual, used)


def test_low_memory_inflates_first_the_guest_with_most_above_its_floor() -> None:
    host = HostPressure(TOTAL, 7_000)  # 3,000 MiB short of 10 %
    guests = [guest("small", 4000), guest("big", 16000)]
    # big: floor 8,000 (50 %), a quarter is 4,000: takes the whole 3,000
    assert plan(host, guests) == {"big": 13_000}


def test_a_quarter_per_pass_then_the_next_guest() -> None:
    host = HostPressure(TOTAL, 1_000)  # 9,000 short
    got = plan(host, [guest("a", 16000), guest("b", 16000), guest("c", 4000)])
    assert got == {"a": 12_000, "b": 12_000, "c": 3_000}


def test_a_stall_takes_at_least_2_percent_even_with_memory_available() -> None:
    assert plan(HostPressure(TOTAL, 15_000, stall_avg10=12.5), [guest("a", 16000)]) == {"a": 14_000}


def test_between_10_and_20_percent_nothing_moves_and_above_20_balloons_deflate_a_step() -> None:
    assert plan(HostPressure(TOTAL, 15_000), [guest("a", 16000, 8000)]) == {}
    assert plan(HostPressure(TOTAL, 30_000), [guest("a", 16000, 8000), guest("b", 4000)]) == {"a": 12_000}
    assert plan(HostPressure(TOTAL, 21_000), [guest("a", 16000, 8000)]) == {"a": 9_000}  # within 1,000 spare


def test_the_floor() -> None:
    assert floor_mib(guest("a", 8000, used=1000), 50) == 4000
    assert floor_mib(guest("a", 8000, used=6000), 50) == 6800  # use plus a tenth
    assert floor_mib(guest("a", 8000, used=None), 10) == 8000  # use unknown: nothing taken
    assert plan(HostPressure(TOTAL, 0), [guest("a", used=None)]) == {}


@given(
    st.integers(0, TOTAL),
    st.floats(0, 100),
    st.lists(st.tuples(st.integers(64, 32000), st.floats(0.3, 1.0), st.none() | st.integers(0, 32000)), max_size=8),
    st.integers(10, 100),
)
def test_a_plan_keeps_every_guest_between_its_floor_and_its_memory_and_moves_a_quarter_at_most(
    available: int, stall: float, specs: list[tuple[int, float, int | None]], floor_percent: int
) -> None:
    guests = []
    for i, (memory, share, used) in enumerate(specs):
        g = guest(f"g{i}", memory, max(1, int(memory * share)), None if used is None else min(used, memory))
        guests.append(g)
    host = HostPressure(TOTAL, available, stall)
    moves = plan(host, guests, floor_percent)
    for g in guests:
        if g.id not in moves:
            continue
        new = moves[g.id]
        assert new != g.actual_mib and abs(new - g.actual_mib) <= max(1, g.memory_mib // 4)
        assert new <= g.memory_mib
        if new < g.actual_mib:  # inflated: never below the floor
            assert new >= floor_mib(g, floor_percent)
    shrink = sum(g.actual_mib - moves[g.id] for g in guests if moves.get(g.id, g.actual_mib) < g.actual_mib)
    grow = sum(moves[g.id] - g.actual_mib for g in guests if moves.get(g.id, g.actual_mib) > g.actual_mib)
    assert not (shrink and grow)
    if grow:
        assert grow <= available - TOTAL * 20 // 100


def test_parse_pressure() -> None:
    meminfo = "MemTotal:       16384000 kB\nMemFree: 1 kB\nMemAvailable:    1638400 kB\n"
    psi = "some avg10=12.50 avg60=3.00 avg300=0.10 total=1\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
    assert parse_pressure(meminfo, psi) == HostPressure(16000, 1600, 12.5)
    assert parse_pressure(meminfo, "") == HostPressure(16000, 1600, 0.0)
    with pytest.raises(ValueError):
        parse_pressure("MemTotal: 1 kB\n", "")


async def test_the_controller_resizes_only_ballooned_running_guests_and_reports_what_it_took(tmp_path: Path) -> None:
    boot = tmp_path / "instance-boot"
    boot.mkdir()
    (boot / "vmlinuz").write_bytes(b"k")
    runtime = FakeRuntime()

    async def memory() -> HostMemory:
        return HostMemory(64_000)

    conv = InstancesConverger({"qemu": runtime}, boot, memory, list, inline)
    pressure = HostPressure(TOTAL, 5_000)

    async def read() -> HostPressure:
        return pressure

    ctl = BalloonController({"qemu": runtime}, conv.ballooned, read, 50, reclaimed=conv.balloon_mib)

    def vm(iid: str, balloon: bool, state: str = "RUNNING") -> spec_pb2.Instance:
        inst = spec_pb2.Instance(id=iid, runtime="qemu", vcpus=1, memory_mib=8000, kernel="vmlinuz", state=state)
        inst.placement.balloon = balloon
        return inst

    section = spec_pb2.InstancesSection(instances=[vm("a", True), vm("b", False), vm("c", True, "PAUSED")])
    await conv.converge(section, 1)
    assert conv.ballooned() == [("qemu", "a", 8000)]
    runtime.guest_used["a"] = 1000
    assert await ctl.once() == {"a": 6000}  # a quarter of 8,000
    assert ctl.reclaimed == {"a": 2000} and runtime.balloons["a"] == 6000
    assert ("balloon", "b") not in runtime.calls and ("balloon", "c") not in runtime.calls
    await conv.converge(section, 1)
    assert {s.id: s.balloon_mib for s in conv.statuses} == {"a": 2000, "b": 0, "c": 0}
    pressure = HostPressure(TOTAL, 50_000)
    assert await ctl.once() == {"a": 8000}
    assert ctl.reclaimed == {"a": 0}
    # a guest whose use the driver has not reported keeps all of it
    runtime.guest_used.pop("a")
    pressure = HostPressure(TOTAL, 0)
    assert await ctl.once() == {}
    stopped = asyncio.Event()
    stopped.set()
    await ctl.run(stopped, 0.01)  # ends at once when the agent stops


def test_the_floor_must_be_between_10_and_100() -> None:
    async def none() -> None:
        return None

    with pytest.raises(ValueError, match="between 10 and 100"):
        BalloonController({}, list, none, 5)
