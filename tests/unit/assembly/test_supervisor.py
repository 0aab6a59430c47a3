"""The supervisor keeps every loop running: a raise is a restart after back-off, a return is the end."""

from __future__ import annotations

import asyncio
import itertools
import logging
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bc.assembly.supervisor import BASE_S, CAP_S, DONE, RESTARTING, RUNNING, STABLE_S, Supervisor, backoff_s
from bc.seams import virtual_time


class Outage(Exception):
    pass


def test_a_loop_that_raises_is_restarted_and_its_state_says_so(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "bc.assembly.supervisor")

    async def main() -> None:
        clock = virtual_time.virtual_clock()
        sup = Supervisor(clock, random.Random(1), process="api")
        runs: list[float] = []
        healthy = asyncio.Event()

        async def liveness() -> None:
            runs.append(clock.monotonic())
            if len(runs) <= 3:
                raise Outage("store down: connection refused\nforged=1")
            healthy.set()
            await asyncio.Event().wait()  # runs until cancelled, as a loop does

        sup.spawn("liveness", liveness)
        await asyncio.wait_for(healthy.wait(), 600)
        [state] = sup.states()
        assert (state.name, state.state, state.restarts) == ("liveness", RUNNING, 3)
        assert state.last_error == "Outage: store down: connection refused\\x0aforged=1"  # one line
        gaps = [b - a for a, b in itertools.pairwise(runs)]
        assert all(BASE_S / 10 <= g <= CAP_S for g in gaps), gaps
        await sup.stop()

    virtual_time.run(main())
    lines = [r.getMessage() for r in caplog.records if "event=loop.restarting" in r.getMessage()]
    assert len(lines) == 3 and all("loop=liveness" in line and "\n" not in line for line in lines)


def test_a_loop_that_keeps_failing_is_retried_no_faster_than_its_back_off() -> None:
    async def main() -> tuple[int, str]:
        clock = virtual_time.virtual_clock()
        sup = Supervisor(clock, random.Random(2))
        attempts = 0

        async def register() -> None:
            nonlocal attempts
            attempts += 1
            raise Outage("store down")

        sup.spawn("register", register)
        await virtual_time.advance(3600)
        [state] = sup.states()
        await sup.stop()
        return attempts, state.state

    attempts, state = virtual_time.run(main())
    assert state == RESTARTING
    # An hour of a store that never comes back: retried, but at most a few times a minute once capped.
    assert 60 <= attempts <= 3600 / (BASE_S / 10)
    assert attempts < 3600 / 2  # never a spin


def test_a_loop_that_returns_is_done_and_not_restarted() -> None:
    async def main() -> list[str]:
        clock = virtual_time.virtual_clock()
        sup = Supervisor(clock, random.Random(3))
        calls = 0

        async def once() -> None:
            nonlocal calls
            calls += 1

        sup.spawn("once", once)
        await virtual_time.advance(100)
        assert calls == 1
        return [s.state for s in sup.states()]

    assert virtual_time.run(main()) == [DONE]


def test_stop_cancels_every_loop_and_names_keep_their_order() -> None:
    async def main() -> None:
        sup = Supervisor(virtual_time.virtual_clock(), random.Random(4))
        forever = asyncio.Event()
        tasks = [sup.spawn(n, forever.wait) for n in ("lease", "sweeper", "placement")]
        assert sup.names() == ["lease", "sweeper", "placement"]
        with pytest.raises(ValueError, match="already supervised"):
            sup.spawn("lease", forever.wait)
        await sup.stop()
        assert all(t.done() for t in tasks)

    virtual_time.run(main())


def test_a_long_healthy_run_resets_the_back_off() -> None:
    async def main() -> list[float]:
        clock = virtual_time.virtual_clock()
        sup = Supervisor(clock, random.Random(5))
        starts: list[float] = []

        async def flaky() -> None:
            starts.append(clock.monotonic())
            if len(starts) < 8:
                raise Outage("quick")
            if len(starts) == 8:
                await asyncio.sleep(STABLE_S + 1)
                raise Outage("after a long run")
            await asyncio.Event().wait()

        sup.spawn("flaky", flaky)
        await virtual_time.advance(3600)
        await sup.stop()
        return starts

    starts = virtual_time.run(main())
    assert len(starts) == 9
    # The restart after a long healthy run waits the first step's back-off (≤ BASE_S), not the capped one.
    assert starts[8] - starts[7] - (STABLE_S + 1) <= BASE_S


@given(st.integers(min_value=1, max_value=10_000), st.integers(min_value=0, max_value=2**32))
def test_backoff_is_bounded(failures: int, seed: int) -> None:
    wait = backoff_s(failures, random.Random(seed))
    assert BASE_S / 10 <= wait <= min(CAP_S, BASE_S * 2 ** min(failures - 1, 16))
