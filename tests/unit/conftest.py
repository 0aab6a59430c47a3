"""Fixtures shared by the unit tests: a real store (inline SQLite on a tmp file) on the virtual
loop's clock (`clock`: `await bc.testing.advance(s)` moves it), a bus,
the one seeded Random (`rng`) and the signer that writers of intent take (`signer`: signing off, explicitly).

A directory's own conftest may override any of them (the store tests run over both drivers).
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bc.control.base.bus import Bus
from bc.control.signing.signer import NullSigner
from bc.seams.clock import LoopClock
from bc.store import Store, leases
from bc.store.postgres import PostgresStore
from bc.store.sqlite import InlineSqliteStore
from bc.testing import virtual_clock
from tests.pg import recycled_schema


@pytest.fixture
def clock() -> LoopClock:
    return virtual_clock()


@pytest.fixture(name="store", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def store_on_each_backend(
    request: pytest.FixtureRequest, tmp_path: Path, clock: LoopClock
) -> AsyncIterator[Store]:
    """The inline SQLite store, and the same tests again on PostgreSQL (a schema of their own)."""
    if request.param == "postgres":
        async with recycled_schema() as (url, schema):
            pg = PostgresStore(url, clock, schema=schema, db_clock=False)
            await pg.open()
            try:
                yield pg
            finally:
                await pg.close()
        return
    s = InlineSqliteStore(tmp_path / "store.db", clock)
    await s.open()
    try:
        yield s
    finally:
        await s.close()


@pytest.fixture
def bus() -> Bus:
    return Bus()


@pytest.fixture
def rng() -> random.Random:
    return random.Random(7)


@pytest.fixture
def signer() -> NullSigner:
    """Signing off; a test of signing builds a `KeySigner` itself."""
    return NullSigner()


@pytest.fixture
async def gateway_lease(store: Store) -> None:
    """The lease of gateway `gw-1` (a test calling `hello_transaction` routes as that gateway): held for years."""
    async with store.transaction() as tx:
        await leases.acquire(tx, "gateway:gw-1", "gw-1", await store.now_ms(), 10 * 365 * 86_400_000)
