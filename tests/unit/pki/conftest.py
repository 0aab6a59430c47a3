"""A settable clock for the PKI unit tests (certificates carry wall times, so it starts at real time)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from bc.pki.ca import CertificateAuthority


class FakeClock:
    def __init__(self, now: float) -> None:
        self._now = now

    def now(self) -> float:
        return self._now

    def monotonic(self) -> float:
        return self._now

    async def sleep(self, seconds: float) -> None:
        self._now += seconds

    def advance(self, seconds: float) -> None:
        self._now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(float(int(time.time())))


@pytest.fixture
def ca(tmp_path: Path, clock: FakeClock) -> CertificateAuthority:
    authority, created = CertificateAuthority.load_or_create(tmp_path / "ca", clock)
    assert created
    return authority
