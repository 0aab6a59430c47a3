"""A cancelled caller of the PostgreSQL store is cancelled, whenever the cancel lands (PostgreSQL only).

`bc serve` stops by cancelling its loops. A loop whose cancel is lost goes on forever and the process
never exits: CI once hung 120 s in a lab's teardown this way. The pool waits for a free connection with
Python 3.11's `asyncio.wait_for`, which drops a cancel that lands in the step a connection is handed
over. Here a second caller waits for the only connection while the first returns it, and the cancel is
sent at each of the next steps in turn: the waiter must end cancelled every time, never holding a
transaction nobody will end.
"""

from __future__ import annotations

import asyncio

import pytest

from bc.store.postgres import PostgresStore
from tests.pg import recycled_schema, schema_url

pytestmark = pytest.mark.postgres

STEPS = 16


async def test_a_cancel_is_never_lost_while_waiting_for_a_connection() -> None:
    async with recycled_schema() as (url, schema):
        store = PostgresStore(schema_url(url, schema), pool_max=1)
        await store.open(migrate=False)
        try:
            lost = [k for k in range(STEPS) if not await _cancel_after(store, k)]
        finally:
            await store.close()
    assert lost == [], f"a cancel sent {lost} loop steps after the connection came back was lost"


async def _cancel_after(store: PostgresStore, steps: int) -> bool:
    """Whether the waiter ended cancelled when cancelled `steps` loop steps after the holder let go."""
    holding, let_go = asyncio.Event(), asyncio.Event()

    async def holder() -> None:
        async with store.transaction(write=False):
            holding.set()
            await let_go.wait()
        for _ in range(steps):
            await asyncio.sleep(0)
        waiter_task.cancel()

    async def waiter() -> None:
        async with store.transaction(write=False):
            await asyncio.Event().wait()  # only a cancel ends this

    holder_task = asyncio.create_task(holder())
    await holding.wait()
    waiter_task = asyncio.create_task(waiter())
    for _ in range(5):  # the waiter reaches the pool's queue
        await asyncio.sleep(0)
    let_go.set()
    await holder_task
    done, _ = await asyncio.wait([waiter_task], timeout=5.0)
    if not done:
        waiter_task.cancel()  # a second cancel frees the connection for the next round
        await asyncio.wait([waiter_task], timeout=5.0)
        return False
    return waiter_task.cancelled()
