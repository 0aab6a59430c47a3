"""`bc join`: a token becomes this node's identity.

1. Parse the token and fetch the server's CA over a raw TLS handshake; keep it
   only if its fingerprint matches the token's pin.
2. Derive the token's client certificate from its secret and call `Join` over
   mutual TLS, with a CSR for a key generated here (it never leaves the host).
3. Store `identity.json`, `node.key` (0600), `node.crt` and `ca.crt`.
"""

from __future__ import annotations

import asyncio
import base64
import socket
from dataclasses import dataclass
from pathlib import Path

import grpc
from cryptography import x509

from agent.identity import Identity, write_atomic
from bc.clock import SystemClock
from bc.errors import BcError, Unavailable, UsageError
from bc.pki import keys, tokens
from bc.pki.discovery import fetch_pinned_ca
from bc.pki.identity import make_csr
from bc.protocol.pb import join_pb2
from bc.wire.status import status_to_error
from bc.wire.stubs import join_pb2_grpc
from bc.wire.tls import channel_credentials


@dataclass(frozen=True)
class JoinResult:
    node_id: str
    ca_fingerprint: str
    cert_not_after: float
    data_dir: Path


def split_server(server: str) -> tuple[str, int]:
    host, sep, port = server.rpartition(":")
    if not sep or not port.isdigit():
        raise UsageError(f"--server must be HOST:PORT, not {server!r}")
    return host.strip("[]"), int(port)


async def join_node(server: str, token: str, data_dir: Path) -> JoinResult:
    parsed = tokens.parse_token(token)
    host, port = split_server(server)
    if Identity.exists(data_dir):
        ident = Identity.load(data_dir)
        raise UsageError(f"{data_dir} already holds the identity of node {ident.node_id}; use another --data-dir")
    ca_pem = await asyncio.to_thread(fetch_pinned_ca, host, port, parsed.ca_pin)
    join_key_pem, join_cert_pem = tokens.join_client_credentials(parsed, SystemClock())
    node_key = keys.generate_key()
    csr = make_csr(node_key, "pending")
    from cryptography.hazmat.primitives import serialization

    req = join_pb2.JoinRequest(csr_der=csr.public_bytes(serialization.Encoding.DER), hostname=socket.gethostname())
    creds = channel_credentials(ca_pem, join_key_pem, join_cert_pem)
    try:
        async with grpc.aio.secure_channel(server, creds) as ch:
            resp: join_pb2.JoinResponse = await join_pb2_grpc.JoinStub(ch).Join(req, timeout=20)
    except grpc.aio.AioRpcError as e:
        err: BcError = status_to_error(e.code(), e.details() or "")
        if isinstance(err, Unavailable):
            raise Unavailable(f"cannot reach bc serve at {server}: {e.details()}") from None
        raise err from None
    cert = x509.load_pem_x509_certificate(resp.cert_pem)
    ident = Identity(
        node_id=resp.node_id,
        role=resp.role,
        server=server,
        identity_generation=resp.identity_generation,
        ca_fingerprint=parsed.ca_pin,
        trust_bundle_b64=base64.b64encode(resp.trust.SerializeToString()).decode(),
    )
    await asyncio.to_thread(_store_identity, data_dir, ident, node_key, resp.cert_pem, ca_pem)
    return JoinResult(resp.node_id, parsed.ca_pin, cert.not_valid_after_utc.timestamp(), data_dir)


def _store_identity(data_dir: Path, ident: Identity, node_key: keys.PrivateKey, cert_pem: bytes, ca_pem: bytes) -> None:
    """Key first (0600), then certificates, then identity.json last: its presence means a complete identity."""
    data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    keys.write_private_key(data_dir / "node.key", node_key)
    write_atomic(data_dir / "node.crt", cert_pem)
    write_atomic(data_dir / "ca.crt", ca_pem)
    ident.save(data_dir)
