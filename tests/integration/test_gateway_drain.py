"""A gateway's drain (`bc serve` stopping, a simulated control-plane restart) ends, with no node left routed
to it: it closes the sessions open when it begins and the streams admitted before it whose Hello is still on
its way, and refuses new streams."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from bc.errors import Unavailable
from tests.integration.conftest import InprocLab


def held(real: Callable[..., Awaitable[Any]], waiting: asyncio.Event, go: asyncio.Event, *, after: bool) -> Any:
    """`real`, held at the test's word before it runs or after it returned."""

    async def call(*args: Any) -> Any:
        if not after:
            waiting.set()
            await go.wait()
        result = await real(*args)
        if after:
            waiting.set()
            await go.wait()
        return result

    return call


@pytest.mark.parametrize("hello", ["waits for the revocation read", "waits for its transaction", "is written"])
async def test_a_drain_ends_with_a_node_s_hello_on_its_way_and_leaves_no_node_routed_here(
    lab: InprocLab, monkeypatch: pytest.MonkeyPatch, hello: str
) -> None:
    await lab.join("n1")
    await lab.join("n2")
    await lab.start_node("n1")
    await lab.wait_connected("n1")
    gw = lab.server.gateway
    assert gw is not None

    # n2's stream is admitted and held before it is served (its serial's revocation read), or its Hello is
    # held before its transaction, or after it committed (the node routed here in the store) and before the
    # session registers.
    waiting, go = asyncio.Event(), asyncio.Event()
    if hello == "waits for the revocation read":
        monkeypatch.setattr(gw, "refuse_revoked", held(gw.refuse_revoked, waiting, go, after=False))
    elif hello == "waits for its transaction":
        monkeypatch.setattr(gw, "hello_slot", held(gw.hello_slot, waiting, go, after=False))
    else:
        monkeypatch.setattr(gw.group, "run", held(gw.group.run, waiting, go, after=True))
    await lab.start_node("n2")
    await asyncio.wait_for(waiting.wait(), 15)
    drain = asyncio.create_task(gw.drain())
    await asyncio.sleep(0)  # the drain's first step: it closes every stream and refuses new ones
    go.set()

    await asyncio.wait_for(drain, 15)
    assert not gw.sessions and not gw.streams
    with pytest.raises(Unavailable, match="draining"):  # what n1 and n2, redialing, are told
        gw.admit()
    for node_id in ("n1", "n2"):
        assert (await lab.admin.get_node(node_id)).state != "connected", node_id
