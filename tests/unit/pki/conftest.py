"""A settable clock for the PKI unit tests (certificates carry wall times, so it starts at real time)."""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest

from bc.pki.ca import CertificateAuthority
from bc.pki.secrets_source import SystemSecrets

RNG = random.Random(1)  # ids and serials, as the one seeded Random of a process would give them
SECRETS = SystemSecrets()


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
    authority, created = CertificateAuthority.load_or_create(tmp_path / "ca", clock, RNG, SECRETS)
    assert created
    return authority
