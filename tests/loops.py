"""Which event loop an async test runs on, through pytest-asyncio's `pytest_asyncio_loop_factories` hook.

A test marked `virtual_time` runs on `bc.seams.virtual_time.VirtualTimeLoop` (time jumps to the next timer when
every task waits), one marked `wall_clock` on the ordinary loop; an unmarked test on the loop of the deepest
directory in `DIRECTORY_LOOPS` that holds it, else on the ordinary loop. Tests over real gRPC, subprocesses
or aiosqlite under a pending timer need the wall clock: that work completes in threads the virtual loop
cannot see, so it would jump past it. So do tests of what reads the host's clock (`bc doctor`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

import pytest

from bc.seams.virtual_time import VirtualTimeLoop

LoopFactories = Mapping[str, Callable[[], asyncio.AbstractEventLoop]]

VIRTUAL: LoopFactories = {"virtual": VirtualTimeLoop}
WALL: LoopFactories = {"asyncio": asyncio.new_event_loop}

DIRECTORY_LOOPS: Mapping[str, LoopFactories] = {
    "tests/unit": VIRTUAL,
    "tests/sim": VIRTUAL,  # SessionPair: the whole control loop on in-memory links
    "tests/unit/doctor": WALL,  # files, certificates and a TLS listener judged against the host's clock
    "tests/tui": WALL,  # Textual's pilot and real gRPC complete work the virtual loop cannot see
}


def register_markers(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "virtual_time: run on the virtual-time loop (bc.seams.virtual_time)")
    config.addinivalue_line("markers", "wall_clock: run on the ordinary loop and the host's clock")


def loop_factories(config: pytest.Config, item: pytest.Item) -> LoopFactories:
    if item.get_closest_marker("wall_clock") is not None:
        return WALL
    if item.get_closest_marker("virtual_time") is not None:
        return VIRTUAL
    holding = [d for d in DIRECTORY_LOOPS if item.path.is_relative_to(config.rootpath / d)]
    return DIRECTORY_LOOPS[max(holding, key=len)] if holding else WALL
