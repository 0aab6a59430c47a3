"""`bc.runtime.aio.cancel_and_wait`: how `bc serve` and `bc node` stop their loops, even one that drops a cancel."""

from __future__ import annotations

import asyncio
import logging

import pytest

from bc.runtime.aio import RECANCEL_S, cancel_and_wait
from bc.seams.virtual_time import run


def test_every_task_ends_and_a_lost_cancel_is_sent_again(caplog: pytest.LogCaptureFixture) -> None:
    ended: list[str] = []

    async def polite() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            ended.append("polite")

    async def deaf() -> None:
        """Drops the first cancel, as a library on 3.11's wait_for can; then loops as a service loop does."""
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            pass
        try:
            while True:
                await asyncio.sleep(5)
        finally:
            ended.append("deaf")

    async def main() -> float:
        loop = asyncio.get_running_loop()
        tasks = [asyncio.create_task(polite(), name="polite"), asyncio.create_task(deaf(), name="deaf")]
        await asyncio.sleep(0)
        t0 = loop.time()
        await cancel_and_wait(tasks)
        assert all(t.done() for t in tasks)
        return loop.time() - t0

    with caplog.at_level(logging.WARNING, logger="bc.aio"):
        took = run(main())
    assert sorted(ended) == ["deaf", "polite"]
    assert took == pytest.approx(RECANCEL_S)
    assert [r.getMessage() for r in caplog.records] == ["event=task.cancel-lost task=deaf; cancelling it again"]


def test_nothing_to_cancel_returns_at_once() -> None:
    async def main() -> None:
        await cancel_and_wait([])

    run(main())
