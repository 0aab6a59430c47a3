"""Join tokens and joining: a one-time token becomes a node certificate.

The token's secret derives a key whose self-signed root the server trusts for
client TLS until the token is used or expires, so the joining node proves the
token over mutual TLS before any request is read. The server keeps only the
secret's hash and that public root. Joining consumes the token in the same
transaction that records the certificate: a token works once.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from bc.clock import Clock
from bc.control.bus import Bus
from bc.control.events import publish
from bc.control.specs import write_spec
from bc.errors import Unauthenticated, UsageError
from bc.pki import tokens as pki_tokens
from bc.pki.ca import CertificateAuthority
from bc.store import Store
from bc.store import identity as id_sql
from bc.store import nodes as nodes_sql

NODE_ID = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
ROLES = ("node", "site", "ramdisk")
MIN_TTL_S, MAX_TTL_S = 60, 7 * 24 * 3600
NODE_CERT_TTL_S = 24 * 3600


def check_node_id(node_id: str) -> None:
    if not NODE_ID.match(node_id):
        raise UsageError(
            f"invalid node id {node_id!r}: use 1-63 lowercase letters, digits, '.', '_' or '-', starting with a"
            " letter or digit"
        )


@dataclass(frozen=True)
class IssuedToken:
    token: str
    token_id: str
    node_id: str
    role: str
    expires_at_ms: int


async def create_token(
    store: Store, bus: Bus, ca: CertificateAuthority, clock: Clock, node_id: str, role: str, ttl_s: float
) -> IssuedToken:
    check_node_id(node_id)
    if role not in ROLES:
        raise UsageError(f"unknown role {role!r}; roles are {', '.join(ROLES)}")
    if not MIN_TTL_S <= ttl_s <= MAX_TTL_S:
        raise UsageError(f"a token's ttl must be between 1m and 7d, not {ttl_s:.0f}s")
    new = pki_tokens.create_token(ca.fingerprint, ttl_s, clock)
    now_ms = await store.now_ms()
    async with store.transaction() as tx:
        await id_sql.insert_token(
            tx,
            token_id=new.token_id,
            secret_hash=new.secret_hash,
            node_id=node_id,
            role=role,
            root_cert_pem=new.root_cert_pem.decode(),
            created_at_ms=now_ms,
            expires_at_ms=int(new.expires_at * 1000),
        )
        await publish(tx, bus, "token.created", node_id, {"token_id": new.token_id, "role": role}, now_ms)
        tx.on_commit(lambda: bus.token_created(new.token_id, new.root_cert_pem))
    return IssuedToken(new.token, new.token_id, node_id, role, int(new.expires_at * 1000))


@dataclass(frozen=True)
class Joined:
    node_id: str
    role: str
    cert_pem: bytes
    identity_generation: int


async def join(
    store: Store, bus: Bus, ca: CertificateAuthority, token_id: str, csr_der: bytes, hostname: str
) -> Joined:
    """Consume the token and issue the node's certificate for the key in the CSR."""
    try:
        csr = x509.load_der_x509_csr(csr_der)
    except ValueError:
        raise UsageError("the join request's CSR does not parse") from None
    now_ms = await store.now_ms()
    async with store.transaction() as tx:
        tok = await id_sql.get_token(tx, token_id)
        if tok is None:
            raise Unauthenticated("the join token is unknown to this server")
        if tok["used_at_ms"] is not None:
            raise Unauthenticated("the join token has already been used; create a new one with `bc token create`")
        if int(tok["expires_at_ms"]) <= now_ms:
            raise Unauthenticated("the join token has expired; create a new one with `bc token create`")
        if not await id_sql.use_token(tx, token_id, now_ms):
            raise Unauthenticated("the join token is no longer valid")
        node_id, role = str(tok["node_id"]), str(tok["role"])
        created = await nodes_sql.ensure(tx, node_id, role, now_ms)
        idgen = 1 if created else await id_sql.bump_identity_generation(tx, node_id)
        cert = ca.issue_node_cert(csr, node_id, role, idgen, NODE_CERT_TTL_S)
        pem = cert.public_bytes(serialization.Encoding.PEM)
        await id_sql.insert_cert(
            tx,
            serial=format(cert.serial_number, "x"),
            node_id=node_id,
            identity_generation=idgen,
            cert_pem=pem.decode(),
            issued_at_ms=now_ms,
            not_after_ms=int(cert.not_valid_after_utc.timestamp() * 1000),
        )
        if created:
            # The first generation: an empty spec the node converges to at once.
            await write_spec(tx, bus, node_id, lambda spec: None, now_ms, lock=store.for_update())
        await publish(
            tx,
            bus,
            "node.joined",
            node_id,
            {
                "role": role,
                "identity_generation": idgen,
                "hostname": hostname,
                "serial": format(cert.serial_number, "x"),
            },
            now_ms,
        )
    return Joined(node_id, role, pem, idgen)
