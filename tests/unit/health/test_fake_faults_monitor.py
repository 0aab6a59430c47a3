"""Injected faults (agent.hw.fake_faults) through the health monitor: raised, held, cleared, and reset."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.health.monitor import HealthMonitor
from agent.hw.fake import FakeHardware
from agent.hw.fake_faults import BadFault, FakeHealthSource, parse_fault, parse_faults
from agent.offload import inline
from bc.seams.clock import LoopClock


def test_fault_specs_parse_and_bad_ones_say_why() -> None:
    assert parse_fault("xid79:GPU-0123abcd-0000").xid == 79
    assert parse_fault("ECC:3").gpu == "3"
    assert parse_fault("memory-low").gpu == ""
    for bad, why in [
        ("xid79", "names no GPU"),
        ("melt:0", "unknown fault kind"),
        ("ecc:../etc", "neither a GPU uuid"),
        ("disk-low:0", "host fault"),
    ]:
        with pytest.raises(BadFault, match=why):
            parse_fault(bad)


def _monitor(tmp_path: Path, flags: tuple[str, ...] = ()) -> tuple[HealthMonitor, FakeHardware, Path]:
    hw = FakeHardware("hgx-h100-8", "n1")
    faults = tmp_path / "fake-faults"
    src = FakeHealthSource(hw, parse_faults(flags), faults)
    return HealthMonitor(src, LoopClock(), inline), hw, faults


def _gpu(mon: HealthMonitor, uuid: str) -> tuple[str, str]:
    (c,) = [c for c in mon.conditions() if c.type == f"GpuHealthy/{uuid}"]
    return c.status, c.reason


async def poll(mon: HealthMonitor) -> list[str]:
    return [c.type for c in await mon.poll(journal_full=False, offset_ms=0)]


@pytest.mark.parametrize(
    ("fault", "reason"),
    [
        ("ecc", "EccUncorrectable"),
        ("remap-pending", "RowRemapPending"),
        ("remap-failed", "RowRemapFailed"),
        ("throttle", "Throttled"),
        ("offbus", "FallenOffBus"),
    ],
)
async def test_a_state_fault_holds_while_listed_and_clears_when_the_line_goes(
    tmp_path: Path, fault: str, reason: str
) -> None:
    mon, hw, faults = _monitor(tmp_path)
    gpu = hw.inventory().gpus[2].uuid
    first = await poll(mon)
    assert _gpu(mon, gpu) == ("True", "Healthy") and f"GpuHealthy/{gpu}" in first
    faults.write_text(f"# injected\n{fault}:{gpu}\n")
    assert await poll(mon) == [f"GpuHealthy/{gpu}"]
    assert _gpu(mon, gpu) == ("False", reason)
    inv = hw.inventory()
    mon.overlay(inv)
    assert [g.healthy for g in inv.gpus] == [True, True, False, True, True, True, True, True]
    assert await poll(mon) == [], "no change while the fault stays"
    faults.write_text("")
    assert await poll(mon) == [f"GpuHealthy/{gpu}"]
    assert _gpu(mon, gpu) == ("True", "Healthy")


async def test_host_faults_raise_host_resources_exhausted_and_node_ready_false(tmp_path: Path) -> None:
    mon, _, faults = _monitor(tmp_path)
    await poll(mon)
    faults.write_text("memory-low\n")
    assert sorted(await poll(mon)) == ["HostResourcesExhausted", "NodeReady"]
    by = {c.type: (c.status, c.reason) for c in mon.conditions()}
    assert by["HostResourcesExhausted"] == ("True", "MemoryLow") and by["NodeReady"] == (
        "False",
        "HostResourcesExhausted",
    )
    faults.write_text("disk-low\n")
    assert await poll(mon) == ["HostResourcesExhausted"]
    faults.unlink()
    await poll(mon)
    assert {c.type: c.status for c in mon.conditions()}["NodeReady"] == "True"


async def test_an_xid_stays_after_its_line_goes_until_a_reset_that_reads_healthy(tmp_path: Path) -> None:
    mon, hw, faults = _monitor(tmp_path)
    gpu = hw.inventory().gpus[0].uuid
    faults.write_text(f"xid79:{gpu}\n")
    await poll(mon)
    assert _gpu(mon, gpu) == ("False", "Xid79")
    faults.write_text("")
    await poll(mon)
    assert _gpu(mon, gpu) == ("False", "Xid79"), "an XID is an event: it holds for the boot"
    assert await mon.after_reset([gpu]) == {gpu: True}
    assert _gpu(mon, gpu) == ("True", "Healthy")
    faults.write_text(f"xid79:{gpu}\n")
    await poll(mon)
    assert _gpu(mon, gpu) == ("False", "Xid79"), "the line added again is a second event"


async def test_a_reset_keeps_the_xid_of_a_gpu_that_still_shows_ecc_errors(tmp_path: Path) -> None:
    mon, hw, faults = _monitor(tmp_path)
    gpu = hw.inventory().gpus[1].uuid
    faults.write_text(f"xid48:{gpu}\necc:{gpu}\n")
    await poll(mon)
    assert await mon.after_reset([gpu]) == {gpu: False}
    faults.write_text("")
    await poll(mon)
    assert _gpu(mon, gpu) == ("False", "Xid48")


async def test_a_flag_xid_is_one_event_for_the_process(tmp_path: Path) -> None:
    mon, hw, _ = _monitor(tmp_path, ("xid94:1",))
    gpu = hw.inventory().gpus[1].uuid
    await poll(mon)
    assert _gpu(mon, gpu) == ("False", "Xid94")
    await mon.after_reset([gpu])
    await poll(mon)
    assert _gpu(mon, gpu) == ("True", "Healthy"), "the flag's event is not delivered again"


async def test_an_application_xid_raises_nothing_and_a_bad_line_is_skipped(tmp_path: Path) -> None:
    mon, hw, faults = _monitor(tmp_path)
    gpu = hw.inventory().gpus[0].uuid
    faults.write_text(f"xid13:{gpu}\nnot a fault\n")
    await poll(mon)
    assert _gpu(mon, gpu) == ("True", "Healthy")


async def test_the_agents_own_facts_raise_journal_full_clock_skew_and_a_broken_pass(tmp_path: Path) -> None:
    mon, _, _ = _monitor(tmp_path)
    await poll(mon)
    changes = await mon.poll(journal_full=True, offset_ms=-2500, converge_error="OSError: no space")
    assert sorted(c.type for c in changes) == ["ClockSkew", "JournalFull", "NodeReady"]
    by = {c.type: c for c in mon.conditions()}
    assert (by["JournalFull"].status, by["ClockSkew"].status, by["NodeReady"].status) == ("True", "True", "False")
    assert "2500 ms ahead of the server's" in by["ClockSkew"].message
    assert by["NodeReady"].reason == "JournalFull" and "OSError: no space" in by["NodeReady"].message
    await mon.poll(journal_full=False, offset_ms=10, converge_error="")
    assert {c.type: c.status for c in mon.conditions() if c.type in ("JournalFull", "ClockSkew", "NodeReady")} == {
        "JournalFull": "False",
        "ClockSkew": "False",
        "NodeReady": "True",
    }
