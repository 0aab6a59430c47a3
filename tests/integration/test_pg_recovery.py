"""`pg_terminate_backend` on every bc connection mid-run: everything recovers (PostgreSQL only).

What a PostgreSQL restart or a failover does to the connections of a running `bc serve`: every one of
them dies at once, the pool's, the LISTEN relay's. A dead connection found at BEGIN is dropped and the
next one tried, so no caller sees the idle ones die; the relay reconnects. The operator sees a fleet
that works: every call answers, the node stays connected and a command runs end to end.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import psycopg
import pytest

from bc.store.postgres import PostgresStore, application_name
from tests.integration.conftest import InprocLab
from tests.pg import recycled_schema, schema_url

pytestmark = pytest.mark.postgres


@pytest.fixture
async def store_url() -> AsyncIterator[str]:
    """This module's labs run on PostgreSQL only (the conftest's runs every lab on both stores)."""
    async with recycled_schema() as (url, schema):
        yield schema_url(url, schema)


async def terminate_all(store: PostgresStore) -> int:
    async with await psycopg.AsyncConnection.connect(store.url, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = %s",
            (application_name(store.schema),),
        )
        row = await cur.fetchone()
        return int(row[0]) if row else 0


async def test_every_connection_terminated_mid_run_and_the_fleet_carries_on(lab: InprocLab) -> None:
    store = lab.server.store
    assert isinstance(store, PostgresStore)
    await lab.join("n1")
    await lab.start_node("n1")
    first = await lab.wait_connected("n1")
    before = await lab.admin.run_command("n1", "inventory.refresh")

    killed = await terminate_all(store)
    assert killed >= 2  # the pool's connection(s) and the relay's two

    # The pool's dead connections are found at BEGIN and replaced: the operator's next calls just work.
    for _ in range(3):
        assert [n.node_id for n in await lab.admin.list_nodes()] == ["n1"]
    cmd = await lab.admin.run_command("n1", "inventory.refresh")
    done = await lab.wait_event("command.settled", lambda ev, d: ev.subject == cmd.id, timeout=30)
    assert '"succeeded"' in done.data_json
    settled_before = await lab.wait_event("command.settled", lambda ev, d: ev.subject == before.id, timeout=30)
    assert '"succeeded"' in settled_before.data_json
    node = await lab.admin.get_node("n1")
    assert node.state == "connected" and first.seq > 0
