"""Which event loop an async test runs on, through pytest-asyncio's `pytest_asyncio_loop_factories` hook.

A test marked `virtual_time` runs on `bc.virtual_time.VirtualTimeLoop` (time jumps to the next timer when every
task waits), one marked `wall_clock` on the ordinary loop; a conftest's hook names its directory's default
(tests/unit: virtual; everything else: wall). Tests over real gRPC, aiosqlite or subprocesses need the wall
clock: that work completes in threads the virtual loop cannot see, so it would jump past it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

import pytest

from bc.virtual_time import VirtualTimeLoop

VIRTUAL: Mapping[str, Callable[[], asyncio.AbstractEventLoop]] = {"virtual": VirtualTimeLoop}
WALL: Mapping[str, Callable[[], asyncio.AbstractEventLoop]] = {"asyncio": asyncio.new_event_loop}


def register_markers(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "virtual_time: run on the virtual-time loop (bc.virtual_time)")
    config.addinivalue_line("markers", "wall_clock: run on the ordinary loop and the host's clock")


def loop_factories(
    item: pytest.Item, *, virtual_by_default: bool
) -> Mapping[str, Callable[[], asyncio.AbstractEventLoop]]:
    if item.get_closest_marker("wall_clock") is not None:
        return WALL
    if item.get_closest_marker("virtual_time") is not None:
        return VIRTUAL
    return VIRTUAL if virtual_by_default else WALL
