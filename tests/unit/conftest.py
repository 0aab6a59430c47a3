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

from bc.clock import LoopClock
from bc.control.bus import Bus
from bc.control.signer import NullSigner
from bc.store.sqlite import InlineSqliteStore
from bc.testing import virtual_clock


@pytest.fixture
def clock() -> LoopClock:
    return virtual_clock()


@pytest.fixture
async def store(tmp_path: Path, clock: LoopClock) -> AsyncIterator[InlineSqliteStore]:
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
