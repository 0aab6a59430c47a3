"""Fixtures for the TUI's tests: the app against a real in-process `bc serve`, and helpers to wait on it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

import pytest
from textual.pilot import Pilot

from bc.client.admin import AdminClient
from bc.runtime.config import OperatorConfig
from bc.seams.clock import SystemClock
from tests.integration.conftest import lab  # noqa: F401  (the fixture, for the tests here)
from tui.app import BcTui
from tui.source import Source

SIZE = (120, 40)


def make_app(cfg: OperatorConfig, *, poll_s: float = 1.0, approver_key: str | None = None) -> BcTui:
    @contextlib.asynccontextmanager
    async def connect() -> AsyncIterator[Source]:
        async with AdminClient(cfg, timeout_s=5.0) as client:
            yield client

    return BcTui(connect, SystemClock(), server=cfg.server, approver_key=approver_key, poll_s=poll_s)


async def until(pilot: Pilot[None], pred: Callable[[], object], timeout: float = 15.0, what: str = "") -> None:
    """Let the app run until `pred()` holds (checked after each of its message rounds)."""
    async with asyncio.timeout(timeout):
        while not pred():
            await pilot.pause(0.05)
    assert pred(), what


@pytest.fixture
def store_url() -> str:
    """The TUI is a client of the Admin API: its labs run on the embedded store only (the integration
    suite runs the same servers on PostgreSQL too)."""
    return ""
