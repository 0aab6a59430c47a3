"""The PKI unit tests' clock: the virtual loop's, set to the real date (openssl judges certificates by it)."""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest

from bc.pki.ca import CertificateAuthority
from bc.pki.secrets_source import SystemSecrets
from bc.seams.clock import LoopClock
from bc.testing import virtual_clock

RNG = random.Random(1)  # ids and serials, as the one seeded Random of a process would give them
SECRETS = SystemSecrets()


@pytest.fixture
def clock() -> LoopClock:
    return virtual_clock(float(int(time.time())))


@pytest.fixture
def ca(tmp_path: Path, clock: LoopClock) -> CertificateAuthority:
    authority, created = CertificateAuthority.load_or_create(tmp_path / "ca", clock, RNG, SECRETS)
    assert created
    return authority
