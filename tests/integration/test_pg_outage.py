"""The database goes away for longer than a gateway's fence (reference: "PostgreSQL unavailable").

A lab on PostgreSQL behind a TCP proxy the test cuts for 30 s (the issue's figure). Meanwhile the gateway fences itself
(its streams close, new sessions are refused) and the node keeps enforcing its hold. After the
database returns: the node is back, its hold was never released (its CDI file never left), it was
never marked unreachable, and a command whose `not_after` passed during the outage is expired.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import pytest

from tests.integration.conftest import InprocLab, open_lab
from tests.pg import recycled_schema, schema_url
from tests.tcp_proxy import CuttableProxy

pytestmark = pytest.mark.postgres

CUT_S = 30.0  # well past the gateway's 10 s fence
FENCE_WAIT_S = 36.0


@pytest.fixture
async def proxied_lab(tmp_path: object) -> AsyncIterator[tuple[InprocLab, CuttableProxy]]:
    async with recycled_schema() as (url, schema):
        parts = urlsplit(url)
        proxy = CuttableProxy(parts.hostname or "127.0.0.1", parts.port or 5432)
        await proxy.start()
        via = url.replace(parts.netloc, f"{parts.username + '@' if parts.username else ''}127.0.0.1:{proxy.port}", 1)
        try:
            async with open_lab(tmp_path, store=schema_url(via, schema)) as lab:  # type: ignore[arg-type]
                yield lab, proxy
        finally:
            await proxy.stop()


async def test_a_database_outage_fences_the_gateway_releases_nothing_and_expires_what_ran_out(
    proxied_lab: tuple[InprocLab, CuttableProxy],
) -> None:
    lab, proxy = proxied_lab
    for n in ("n1", "n2"):
        await lab.join(n)
        await lab.start_node(n)
        await lab.wait_connected(n)
    hold = await lab.admin.reserve(2, node_id="n1")
    await lab.wait_event("reservation.active", lambda ev, d: ev.subject == hold.id)
    cdi = lab.node_dir("n1") / "cdi" / f"bc-{hold.allocation_id}.json"
    assert cdi.exists()
    await lab.stop_node("n2")
    doomed = await lab.admin.run_command("n2", "inventory.refresh", not_after_s=3)
    gw = lab.server.gateway
    seen_before = max((e.seq for e in await lab.admin.list_events(limit=10_000)), default=0)

    proxy.cut()
    cut_at = asyncio.get_running_loop().time()
    async with asyncio.timeout(FENCE_WAIT_S):  # the rule's 10 s is tested alone (test_fence.py); a loaded CI box lags
        while not gw.fence.fenced:  # in-process state, no event can say it while the store is gone
            await asyncio.sleep(0.1)
    assert not gw.sessions
    while asyncio.get_running_loop().time() - cut_at < CUT_S:
        assert cdi.exists()  # the node keeps enforcing its hold while the control plane is gone
        await asyncio.sleep(0.5)
    proxy.heal()

    await lab.wait_event(
        "node.connectivity",
        lambda ev, d: ev.subject == "n1" and d["state"] == "connected" and ev.seq > seen_before,
        timeout=60,
    )
    assert cdi.exists()
    assert (await lab.admin.get_reservation(hold.id)).state == "active"
    expired = await lab.wait_event("command.settled", lambda ev, d: ev.subject == doomed.id, timeout=30)
    assert json.loads(expired.data_json)["state"] == "expired", expired.data_json
    states = [json.loads(e.data_json)["state"] for e in await lab.admin.list_events(type_prefix="node.connectivity")]
    assert "unreachable" not in states
