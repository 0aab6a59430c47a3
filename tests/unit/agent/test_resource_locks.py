"""Per-resource locks: gpu:* conflicts with every GPU lock; unrelated locks run together."""

from __future__ import annotations

import asyncio

from hypothesis import given
from hypothesis import strategies as st

from agent.resource_locks import ResourceLocks, conflicts

names = st.sampled_from(["gpu:a", "gpu:b", "gpu:*", "disk:a", "disk:*", "alloc:x"])


@given(names, names)
def test_conflicts_is_symmetric(a: str, b: str) -> None:
    assert conflicts(a, b) == conflicts(b, a)


def test_conflict_table() -> None:
    assert conflicts("gpu:a", "gpu:a")
    assert conflicts("gpu:*", "gpu:a")
    assert not conflicts("gpu:a", "gpu:b")
    assert not conflicts("gpu:*", "disk:a")


async def test_a_whole_node_lock_waits_for_a_gpu_lock() -> None:
    locks = ResourceLocks()
    order: list[str] = []
    first_in = asyncio.Event()
    release_first = asyncio.Event()

    async def reset() -> None:
        async with locks.hold(["gpu:a"]):
            order.append("reset-start")
            first_in.set()
            await release_first.wait()
            order.append("reset-end")

    async def reboot() -> None:
        await first_in.wait()
        async with locks.hold(["gpu:*"]):
            order.append("reboot")

    async def other_disk() -> None:
        await first_in.wait()
        async with locks.hold(["disk:a"]):
            order.append("disk")
        release_first.set()

    await asyncio.wait_for(asyncio.gather(reset(), reboot(), other_disk()), 5)
    assert order.index("disk") < order.index("reset-end") < order.index("reboot")
