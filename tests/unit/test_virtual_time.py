"""The virtual-time loop (bc/seams/virtual_time.py): time jumps to the next timer only when nothing can run.

The unit tests run on it (tests/unit/conftest.py), so these tests are also what every timed unit test relies on.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import random
import socket
import threading
import time

import pytest

from bc.seams.virtual_time import START, WALL_START, VirtualTimeLoop, advance, run


def now() -> float:
    return asyncio.get_running_loop().time()


async def test_unit_tests_run_on_the_virtual_loop_from_its_fixed_start() -> None:
    assert isinstance(asyncio.get_running_loop(), VirtualTimeLoop)
    assert now() == START


@pytest.mark.wall_clock
async def test_a_wall_clock_test_runs_on_the_ordinary_loop() -> None:
    assert not isinstance(asyncio.get_running_loop(), VirtualTimeLoop)


async def test_time_never_moves_while_work_is_ready() -> None:
    loop = asyncio.get_running_loop()
    fired = asyncio.Event()
    loop.call_later(1.0, fired.set)  # a timer is due in a second: nothing may jump to it while work is ready
    seen = set()

    async def busy(n: int) -> None:
        for _ in range(n):
            seen.add(now())
            await asyncio.sleep(0)

    await asyncio.gather(busy(200), busy(300))
    a, b = socket.socketpair()
    with a, b:
        a.setblocking(False)
        b.setblocking(False)
        for i in range(50):  # real I/O that is ready is handled before any jump
            await loop.sock_sendall(a, bytes([i]))
            assert await loop.sock_recv(b, 1) == bytes([i])
            seen.add(now())

    assert seen == {START} and not fired.is_set()
    await fired.wait()
    assert now() == START + 1.0


async def test_sleepers_wake_in_order_at_their_virtual_times() -> None:
    woke: list[tuple[str, float]] = []

    async def sleeper(name: str, seconds: float) -> None:
        await asyncio.sleep(seconds)
        woke.append((name, now()))

    await asyncio.gather(sleeper("slow", 2.5), sleeper("fast", 0.1), sleeper("mid", 1.0))

    assert woke == [("fast", START + 0.1), ("mid", START + 1.0), ("slow", START + 2.5)]


async def test_an_hour_of_sleep_takes_milliseconds_of_wall_time() -> None:
    wall0 = time.perf_counter()
    for _ in range(60):
        await advance(60)
    assert now() == START + 3600
    assert time.perf_counter() - wall0 < 0.5


async def test_asyncio_timeout_and_wait_for_fire_at_their_virtual_deadlines() -> None:
    never = asyncio.Event()
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(5):
            await never.wait()
    assert now() == START + 5

    with pytest.raises(TimeoutError):
        await asyncio.wait_for(never.wait(), 2.5)
    assert now() == START + 7.5

    async with asyncio.timeout(10):  # finishes first: the timeout does not fire, and time stops at the sleep's end
        await asyncio.sleep(3)
    assert now() == START + 10.5


async def test_cancellation_stops_a_sleeper_and_its_deadline_no_longer_moves_time() -> None:
    cancelled_at: list[float] = []

    async def long_sleep() -> None:
        try:
            await asyncio.sleep(100)
        except asyncio.CancelledError:
            cancelled_at.append(now())
            raise

    task = asyncio.create_task(long_sleep())
    await advance(10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await advance(1)

    assert cancelled_at == [START + 10]
    assert now() == START + 11  # the cancelled 100 s deadline did not pull time along


async def test_time_stands_while_an_executor_job_runs() -> None:
    loop = asyncio.get_running_loop()
    loop.call_later(1.0, lambda: None)  # a pending timer the loop must not jump to while the thread works

    result = await asyncio.to_thread(lambda: time.sleep(0.05) or "done")

    assert result == "done" and now() == START


async def test_with_no_timer_the_loop_waits_for_real_io() -> None:
    loop = asyncio.get_running_loop()
    a, b = socket.socketpair()
    with a, b:
        b.setblocking(False)
        writer = threading.Timer(0.05, a.sendall, args=(b"x",))  # another thread, 50 ms of wall time later
        writer.start()
        try:
            assert await loop.sock_recv(b, 1) == b"x"
        finally:
            writer.join()
    assert now() == START


def test_run_starts_where_it_is_told_and_returns_the_result() -> None:
    async def main() -> tuple[float, float]:
        t0 = now()
        await advance(30)
        return t0, now()

    assert run(main()) == (START, START + 30)
    assert run(main(), start=50.0) == (50.0, 80.0)
    loop = VirtualTimeLoop(start=50.0, wall=WALL_START + 7)
    try:
        assert loop.time() == 50.0 and loop.wall_offset == WALL_START + 7 - 50.0
    finally:
        loop.close()


def test_the_same_program_makes_the_same_timeline() -> None:
    async def program(seed: int) -> list[tuple[float, int, int]]:
        rng = random.Random(seed)
        log: list[tuple[float, int, int]] = []

        async def worker(w: int) -> None:
            for step in range(20):
                await asyncio.sleep(rng.uniform(0, 5))
                log.append((now(), w, step))

        async with asyncio.TaskGroup() as tg:
            for w in range(8):
                tg.create_task(worker(w))
        return log

    first = run(program(7))
    assert run(program(7)) == first
    assert run(program(8)) != first
    assert [t for t, _, _ in first] == sorted(t for t, _, _ in first)  # the log is in time order


def test_closing_the_loop_fires_no_timer_that_was_still_pending() -> None:
    fired: list[float] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        loop.call_later(100, lambda: fired.append(now()))
        executor = concurrent.futures.ThreadPoolExecutor(1)
        loop.set_default_executor(executor)
        executor.submit(time.sleep, 0.2)  # closing joins the executor's thread, 200 ms of wall time

    run(main())
    assert fired == []  # as on the ordinary loop: closing does not run the clock forward
