"""bc/seams/clock.py: the running loop's time is the clock; now() adds a wall offset."""

from __future__ import annotations

import asyncio
import time

import pytest

from bc.runtime.aio import wait_event
from bc.seams.clock import LoopClock, SystemClock
from bc.seams.virtual_time import START, WALL_START, advance, run, virtual_clock

MADE_AT_IMPORT = virtual_clock(1_700_000_000.0)


async def test_a_clock_with_an_offset_reads_loop_time_plus_the_offset() -> None:
    clock = LoopClock(wall_offset=5_000.0)
    assert clock.monotonic() == START and clock.now() == START + 5_000.0

    await advance(12.5)

    assert clock.monotonic() == asyncio.get_running_loop().time() == START + 12.5
    assert clock.now() == START + 12.5 + 5_000.0


async def test_sleeping_on_the_clock_is_sleeping_on_the_loop() -> None:
    clock = virtual_clock()
    other = virtual_clock(WALL_START - 2.0)  # another host's clock two seconds behind
    await clock.sleep(30)
    assert clock.now() == WALL_START + 30 and other.now() == WALL_START + 28  # both moved with the loop, no drift
    assert clock.monotonic() == other.monotonic() == START + 30


def test_a_virtual_clock_outside_a_loop_stands_at_its_start() -> None:
    clock = virtual_clock(1_700_000_000.0)
    assert clock.now() == 1_700_000_000.0 and clock.monotonic() == START


async def test_a_virtual_clock_made_outside_the_loop_reads_the_same_at_the_loops_start() -> None:
    assert MADE_AT_IMPORT.now() == 1_700_000_000.0 and MADE_AT_IMPORT.monotonic() == START


async def test_the_system_clock_reads_a_virtual_loops_own_wall_time() -> None:
    clock = SystemClock()
    assert clock.now() == WALL_START
    await advance(60)
    assert clock.now() == WALL_START + 60 and clock.monotonic() == START + 60


@pytest.mark.wall_clock
async def test_the_system_clock_on_the_ordinary_loop_is_the_hosts_clock() -> None:
    clock = SystemClock()
    loop = asyncio.get_running_loop()
    before_loop, before_wall = loop.time(), time.time()
    mono, wall = clock.monotonic(), clock.now()
    assert before_loop <= mono <= loop.time()
    assert before_wall <= wall <= time.time()


def test_the_system_clock_outside_a_loop_is_the_hosts_clock() -> None:
    clock = SystemClock()
    before_mono, before_wall = time.monotonic(), time.time()
    mono, wall = clock.monotonic(), clock.now()
    assert before_mono <= mono <= time.monotonic()
    assert before_wall <= wall <= time.time()


async def test_a_step_moves_wall_time_but_not_monotonic_time() -> None:
    clock = virtual_clock()
    clock.step(-2.5)  # chrony steps the host's clock back
    assert clock.now() == WALL_START - 2.5 and clock.monotonic() == START
    await advance(1)
    assert clock.now() == WALL_START - 1.5

    with pytest.raises(RuntimeError, match="not ours to step"):
        SystemClock().step(1.0)


async def test_a_shifted_clock_is_another_hosts_clock_on_the_same_loop() -> None:
    clock = virtual_clock()
    await advance(10)
    behind = clock.shifted(-300)
    assert behind.now() == clock.now() - 300 and behind.monotonic() == clock.monotonic()
    await advance(5)
    assert behind.now() == WALL_START + 15 - 300

    with pytest.raises(RuntimeError, match="not ours to step or shift"):
        SystemClock().shifted(1.0)


async def test_a_virtual_clock_made_later_reads_the_time_it_is_given_then() -> None:
    await advance(100)
    clock = virtual_clock(1_700_000_000.0)
    assert clock.now() == 1_700_000_000.0
    await advance(1)
    assert clock.now() == 1_700_000_001.0


async def test_a_worker_thread_reads_the_loop_the_clock_last_read_on() -> None:
    clock, system = virtual_clock(), SystemClock()
    await advance(42)
    assert (clock.now(), system.now()) == (WALL_START + 42, WALL_START + 42)  # both have now seen this loop

    in_thread = await asyncio.to_thread(lambda: (clock.now(), clock.monotonic(), system.now()))

    assert in_thread == (WALL_START + 42, START + 42, WALL_START + 42)


def test_after_its_loop_closes_a_virtual_clock_stands_at_its_start_again() -> None:
    clock = virtual_clock()

    async def main() -> float:
        await advance(5)
        return clock.now()

    assert run(main()) == WALL_START + 5
    assert clock.now() == WALL_START and clock.monotonic() == START


async def test_bc_aio_waits_on_the_same_clock() -> None:
    clock, event = virtual_clock(), asyncio.Event()
    assert not await wait_event(event, 30)
    assert clock.now() == WALL_START + 30

    asyncio.get_running_loop().call_later(5, event.set)
    assert await wait_event(event, 30)
    assert clock.now() == WALL_START + 35
