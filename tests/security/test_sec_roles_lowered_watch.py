"""Attack: an operator lowered to viewer keeps the Watch stream they opened as an operator, so the change of
role never reaches them (their client goes on as if nothing happened). `bc operators role bob viewer` closes
the stream with the reason; a new Watch is taken under the new role."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bc.client.admin import AdminClient
from bc.errors import Unauthenticated
from bc.runtime.config import OperatorConfig
from tests.integration.test_cli_cmd import ok_json
from tests.security.roles_helpers import Lab, operator_config, serve_lab


@pytest.fixture
def lab(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Lab]:
    yield from serve_lab(tmp_path, monkeypatch)


async def watch_until_closed(cfg: OperatorConfig, opened: asyncio.Event) -> tuple[str, float]:
    """Watch as `cfg`; after the first event, wait for the stream to end. Its error and when it came."""
    async with AdminClient(cfg) as client:
        try:
            async for _ in client.watch(type_prefix="node.labelled"):
                opened.set()
        except Unauthenticated as e:
            return e.message, time.monotonic()
    raise AssertionError("the stream ended without a reason")


def test_a_role_lowered_mid_watch_closes_the_stream_with_the_reason(lab: Lab, tmp_path: Path) -> None:
    bob = OperatorConfig.load(operator_config(tmp_path, "bob", role="operator"))

    async def scenario() -> tuple[str, float, float]:
        opened = asyncio.Event()
        watching = asyncio.create_task(watch_until_closed(bob, opened))
        await asyncio.to_thread(ok_json, "nodes", "label", "n1", "rack=r1")
        await asyncio.wait_for(opened.wait(), 30)
        doc = await asyncio.to_thread(ok_json, "operators", "role", "bob", "viewer", "--reason", "moved to support")
        lowered_at = time.monotonic()
        assert doc["role"] == "viewer"
        reason, closed_at = await asyncio.wait_for(watching, 10)
        return reason, lowered_at, closed_at

    reason, lowered_at, closed_at = asyncio.run(scenario())
    assert "operator bob's role was lowered from operator to viewer" in reason, reason
    assert closed_at - lowered_at <= 2.0

    async def again() -> str:
        async with AdminClient(bob) as client:
            return (await client.server_info()).role

    assert asyncio.run(again()) == "viewer"  # the new stream, and every call, is a viewer's
