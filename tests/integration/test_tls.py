"""Mutual TLS over real gRPC on 127.0.0.1: who gets in, and the one join root beside the CA."""

from __future__ import annotations

import asyncio
import random
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from cryptography.x509.oid import NameOID

from bc.errors import Unauthenticated, Unavailable
from bc.pki import keys, tokens
from bc.pki.ca import CertificateAuthority
from bc.pki.discovery import fetch_pinned_ca
from bc.pki.identity import make_csr
from bc.pki.secrets_source import SystemSecrets
from bc.seams.clock import SystemClock
from bc.wire.tls import ServerTLS, channel_credentials, peer_cert_from_context

RNG = random.Random(1)  # ids and serials, as the one seeded Random of a process would give them
SECRETS = SystemSecrets()

_METHOD = "/bc.test.Echo/Who"


async def _who(request: bytes, context: Any) -> bytes:
    """Echo the caller's certificate CN, as the real handlers will read it."""
    cert = peer_cert_from_context(context)
    if cert is None:
        return b"<no certificate>"
    value = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value
    return value.encode() if isinstance(value, str) else value


@dataclass
class Harness:
    ca: CertificateAuthority
    tls: ServerTLS
    port: int
    clock: SystemClock

    async def call(self, creds: grpc.ChannelCredentials) -> bytes:
        # A local subchannel pool: a new connection (and handshake) per call, never one shared by an
        # earlier channel that was admitted with other credentials.
        options = [("grpc.use_local_subchannel_pool", 1)]
        async with grpc.aio.secure_channel(f"127.0.0.1:{self.port}", creds, options=options) as channel:
            reply: bytes = await channel.unary_unary(_METHOD)(b"", timeout=5)
            return reply

    def node_credentials(self, node_id: str) -> grpc.ChannelCredentials:
        key = keys.generate_key()
        cert = self.ca.issue_node_cert(make_csr(key, node_id), node_id, "gpu", 1)
        return channel_credentials(self.ca.ca_pem, keys.key_to_pem(key), keys.cert_to_pem(cert))


@pytest.fixture
async def harness(tmp_path: Path) -> AsyncIterator[Harness]:
    clock = SystemClock()
    ca, _ = CertificateAuthority.load_or_create(tmp_path / "ca", clock, RNG, SECRETS)
    server_key = keys.generate_key()
    server_cert = ca.issue_server_cert(["127.0.0.1"], server_key)
    tls = ServerTLS(keys.key_to_pem(server_key), keys.cert_to_pem(server_cert), ca.ca_pem)
    server = grpc.aio.server()
    handler = grpc.method_handlers_generic_handler("bc.test.Echo", {"Who": grpc.unary_unary_rpc_method_handler(_who)})
    server.add_generic_rpc_handlers((handler,))
    port = server.add_secure_port("127.0.0.1:0", tls.credentials())
    await server.start()
    try:
        yield Harness(ca, tls, port, clock)
    finally:
        await server.stop(None)


async def _refused(harness: Harness, creds: grpc.ChannelCredentials) -> grpc.StatusCode:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await harness.call(creds)
    code: grpc.StatusCode = info.value.code()
    return code


async def test_a_node_certificate_is_accepted(harness: Harness) -> None:
    assert await harness.call(harness.node_credentials("n1")) == b"node:n1"


async def test_a_client_without_a_certificate_is_refused(harness: Harness) -> None:
    creds = grpc.ssl_channel_credentials(root_certificates=harness.ca.ca_pem)
    assert await _refused(harness, creds) == grpc.StatusCode.UNAVAILABLE


async def test_a_node_certificate_from_another_ca_is_refused(harness: Harness) -> None:
    other = CertificateAuthority.create(harness.clock, RNG, SECRETS)
    key = keys.generate_key()
    cert = other.issue_node_cert(make_csr(key, "n1"), "n1", "gpu", 1)
    creds = channel_credentials(harness.ca.ca_pem, keys.key_to_pem(key), keys.cert_to_pem(cert))
    assert await _refused(harness, creds) == grpc.StatusCode.UNAVAILABLE


async def test_any_tokens_join_leaf_passes_the_handshake_with_no_change_to_the_server(harness: Harness) -> None:
    """The TLS configuration knows no token: a token made after the server started is handshaken at once."""
    for _ in range(2):
        new = tokens.create_token(harness.ca.fingerprint, 600, harness.clock, RNG, SECRETS)
        key_pem, cert_pem = tokens.join_client_credentials(tokens.parse_token(new.token), harness.clock)
        creds = channel_credentials(harness.ca.ca_pem, key_pem, cert_pem)
        assert await harness.call(creds) == f"join:{new.token_id}".encode()
    assert await harness.call(harness.node_credentials("n1")) == b"node:n1"  # the CA still counts


async def test_a_join_leaf_under_another_installs_join_root_is_refused(harness: Harness) -> None:
    other = CertificateAuthority.create(harness.clock, RNG, SECRETS)
    new = tokens.create_token(other.fingerprint, 600, harness.clock, RNG, SECRETS)
    key_pem, cert_pem = tokens.join_client_credentials(tokens.parse_token(new.token), harness.clock)
    assert await _refused(harness, channel_credentials(harness.ca.ca_pem, key_pem, cert_pem)) == (
        grpc.StatusCode.UNAVAILABLE
    )


async def test_every_process_derives_the_same_join_root_from_the_ca(harness: Harness) -> None:
    key = keys.generate_key()
    again = ServerTLS(
        keys.key_to_pem(key), keys.cert_to_pem(harness.ca.issue_server_cert(["h"], key)), harness.ca.ca_pem
    )
    assert again.join_root_pem == harness.tls.join_root_pem == tokens.join_root_pem(harness.ca.fingerprint)


async def test_fetch_pinned_ca_returns_the_pinned_ca(harness: Harness) -> None:
    pem = await asyncio.to_thread(fetch_pinned_ca, "127.0.0.1", harness.port, harness.ca.fingerprint, 5)
    assert pem == harness.ca.ca_pem


async def test_fetch_pinned_ca_refuses_another_pin(harness: Harness) -> None:
    wrong = "sha256:" + "00" * 32
    with pytest.raises(Unauthenticated, match=r"does not match the join token's pin \(expected sha256:00"):
        await asyncio.to_thread(fetch_pinned_ca, "127.0.0.1", harness.port, wrong, 5)


def test_fetch_pinned_ca_from_nobody_is_unavailable() -> None:
    with socket.socket() as s:  # a port that was just free: nothing listens on it
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(Unavailable, match=f"cannot reach the server at 127.0.0.1:{port}"):
        fetch_pinned_ca("127.0.0.1", port, "sha256:" + "00" * 32, timeout=2)
