"""Fixtures for `bc doctor`: a clock at the wall clock's time, a CA with a TLS listener, a `Cluster`.

The clock starts at the wall clock's time so the CLI, which reads the wall clock, agrees with the files.
"""

from __future__ import annotations

import random
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bc.pki import keys
from bc.pki.ca import CertificateAuthority
from bc.pki.secrets_source import SystemSecrets
from bc.seams.clock import LoopClock
from tests.unit.doctor.doctor_helpers import Cluster

RNG = random.Random(1)  # ids and serials, as the one seeded Random of a process would give them
SECRETS = SystemSecrets()


@pytest.fixture
def clock() -> LoopClock:
    """The host's clock, made steppable (a fixed offset): on the ordinary loop it reads `time.time()`."""
    return LoopClock(wall_offset=time.time() - time.monotonic())


@pytest.fixture
def tls_listener(tmp_path: Path, clock: LoopClock) -> Iterator[tuple[CertificateAuthority, str]]:
    """A CA, and a TLS server presenting a leaf and that CA the way `bc serve` does (the chain, leaf first)."""
    ca, _ = CertificateAuthority.load_or_create(tmp_path / "ca", clock, RNG, SECRETS)
    key = keys.generate_key()
    chain = tmp_path / "server-chain.pem"
    chain.write_bytes(keys.cert_to_pem(ca.issue_server_cert(["127.0.0.1"], key)) + ca.ca_pem)
    key_file = tmp_path / "server.key"
    key_file.write_bytes(keys.key_to_pem(key))
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(chain, key_file)
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.05)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            conn.settimeout(2.0)
            try:
                with ctx.wrap_socket(conn, server_side=True):
                    pass  # the handshake is all a doctor asks for
            except OSError:
                conn.close()

    t = threading.Thread(target=serve, name="tls-listener", daemon=True)
    t.start()
    try:
        yield ca, f"127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        t.join(5)
        listener.close()


@pytest.fixture
def cluster(tmp_path: Path, clock: LoopClock, tls_listener: tuple[CertificateAuthority, str]) -> Cluster:
    ca, address = tls_listener
    return Cluster(tmp_path, clock, ca, address)
