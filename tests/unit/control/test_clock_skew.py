"""ClockSkew: a process more than 1 s off the store's clock logs one warning, and one line when it recovers.

The store runs on the `clock` fixture; the process under test gets a clock of its own, set off by as much
as the test needs, which is what a control plane on another host than PostgreSQL sees.
"""

from __future__ import annotations

import asyncio
import logging

import pytest

from bc.control.doctor.clock_skew import ClockSkewMonitor
from bc.seams.clock import LoopClock
from bc.store.sqlite import InlineSqliteStore
from bc.testing import advance

LOGGER = "bc.control.doctor.clock_skew"


def skew_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER]


async def test_a_process_two_seconds_behind_the_store_is_skewed_and_says_so_once(
    store: InlineSqliteStore, clock: LoopClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    monitor = ClockSkewMonitor(store, clock.shifted(-2.0))

    assert await monitor.sample() == 2000
    assert monitor.skewed and monitor.offset_ms == 2000
    await monitor.sample()

    [line] = skew_lines(caplog)
    assert line.startswith("event=clock.skew offset_ms=2000 ")
    assert [r.levelno for r in caplog.records if r.name == LOGGER] == [logging.WARNING]


async def test_a_process_ahead_of_the_store_gets_a_negative_offset(store: InlineSqliteStore, clock: LoopClock) -> None:
    monitor = ClockSkewMonitor(store, clock.shifted(1.5))
    assert await monitor.sample() == -1500
    assert monitor.skewed


async def test_recovery_is_logged_once_and_clears_the_skew(
    store: InlineSqliteStore, clock: LoopClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    local = clock.shifted(-3.0)
    monitor = ClockSkewMonitor(store, local)
    await monitor.sample()
    local.step(2.9)  # chrony steps the clock

    assert await monitor.sample() == 100
    await monitor.sample()

    assert not monitor.skewed
    assert skew_lines(caplog) == [
        "event=clock.skew offset_ms=3000 threshold_ms=1000 store=" + store.description,
        "event=clock.skew_recovered offset_ms=100",
    ]


async def test_within_the_threshold_nothing_is_logged(
    store: InlineSqliteStore, clock: LoopClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    monitor = ClockSkewMonitor(store, clock.shifted(1.0))
    assert await monitor.sample() == -1000  # exactly at the threshold is not skew
    assert not monitor.skewed
    assert skew_lines(caplog) == []


async def test_the_embedded_store_shares_the_process_clock_so_there_is_no_offset(
    store: InlineSqliteStore, clock: LoopClock
) -> None:
    monitor = ClockSkewMonitor(store, clock)
    assert await monitor.sample() == 0
    assert not monitor.skewed


async def test_run_samples_every_interval_and_warns_once_while_the_skew_lasts(
    store: InlineSqliteStore, clock: LoopClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    local = clock.shifted(0.0)
    monitor = ClockSkewMonitor(store, local)
    task = asyncio.create_task(monitor.run(interval_s=10))  # samples at 0, 10, 20, 30 s
    try:
        await advance(5)
        for _ in range(3):
            local.step(10)  # this host's clock runs away: 10 s ahead at 5 s, 20 s at 15 s, 30 s at 25 s
            await advance(10)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    assert monitor.offset_ms == -30_000
    assert monitor.skewed
    assert [line.split(" ")[0] for line in skew_lines(caplog)] == ["event=clock.skew"]
