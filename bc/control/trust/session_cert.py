"""Join.SessionCert: a TPM identity's session key, certified for the node's sessions by a proof of its TPM key.

The rule is `bc.pki.session_cert.decide` (pure; its module docstring has the table and the proof's bytes).
Here the server checks everything, in this order:

1. the certificate is this CA's, for a node (`peer_identity` without dates: `decide` judges them in store time);
2. the proof verifies with that certificate's key over the node, its serial, the certificate, the CSR, the
   timestamp and the nonce; until it does the caller has shown nothing, and is refused without an event;
3. then, each refusal publishing `security.session-cert.refused` naming the node with its reason: the CSR
   (`session-cert:bad-csr`), and, with the node's row locked, `decide` over what the store holds about the
   certificate and the timestamp against the store's clock (`session-cert:unknown-certificate`,
   `session-cert:session-certificate`, `session-cert:not-tpm`, `session-cert:revoked`,
   `session-cert:old-identity`, `session-cert:not-latest`, `session-cert:expired`,
   `session-cert:stale-timestamp`).

Success issues a certificate for the CSR's key naming the node as its node certificate does plus
`urn:bc:session-of:<serial>`, until `session_not_after_ms` (24 h, or the node certificate's expiry if sooner),
stores it in `node_certs` with `session_of` (so `revoke_node` revokes it with the node, and the gateways'
revocation feed ends its session), and publishes `node.session-cert.issued`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from bc.control.base.bus import Bus
from bc.control.base.events import publish
from bc.control.trust.identity import Refused
from bc.errors import Unauthenticated, UsageError
from bc.pki import session_cert as rules
from bc.pki import tpm_attest
from bc.pki.ca import CertificateAuthority
from bc.pki.identity import PeerIdentity, peer_identity
from bc.store import Store
from bc.store import identity as id_sql

log = logging.getLogger("bc.control.trust.session_cert")


@dataclass(frozen=True)
class SessionIssued:
    node_id: str
    serial: str  # the session certificate's
    session_of: str  # the node certificate's
    cert_pem: bytes
    not_after_ms: int


async def issue_session_cert(
    store: Store,
    bus: Bus,
    ca: CertificateAuthority,
    cert_der: bytes,
    csr_der: bytes,
    timestamp_ms: int,
    nonce: bytes,
    proof: bytes,
) -> SessionIssued:
    """A session certificate for the CSR's key, proved by the key of the node certificate `cert_der` (see above)."""
    try:
        cert = x509.load_der_x509_certificate(cert_der)
    except ValueError:
        raise UsageError("the session certificate request's certificate does not parse") from None
    peer = peer_identity(cert, ca.certificate)  # no `now`: its dates are `decide`'s to judge, in store time
    if peer.kind != "node":
        raise Unauthenticated(f"a session certificate needs a node certificate, not a {peer.kind} one")
    rules.verify_session_proof(cert, peer.name, cert_der, csr_der, timestamp_ms, nonce, proof)
    now_ms = await store.now_ms()
    try:
        issued = await _issue_proved(store, bus, ca, peer, cert, csr_der, timestamp_ms, now_ms)
    except Refused as r:
        raise await r.record(store, bus, "session-cert", peer, now_ms) from None
    log.info("event=node.session-cert.issued node=%s serial=%s session_of=%s", peer.name, issued.serial, peer.serial)
    return issued


async def _issue_proved(
    store: Store,
    bus: Bus,
    ca: CertificateAuthority,
    peer: PeerIdentity,
    cert: x509.Certificate,
    csr_der: bytes,
    timestamp_ms: int,
    now_ms: int,
) -> SessionIssued:
    node_id, serial = peer.name, peer.serial
    try:
        csr = x509.load_der_x509_csr(csr_der)
    except ValueError:
        raise Refused(
            "session-cert:bad-csr", UsageError("the session certificate request's CSR does not parse")
        ) from None
    if not csr.is_signature_valid:
        raise Refused(
            "session-cert:bad-csr", UsageError("the session certificate request's CSR signature does not match its key")
        )
    async with store.transaction() as tx:
        current = await id_sql.lock_node_identity(tx, node_id)
        row = await id_sql.get_cert(tx, serial)
        known = row is not None and str(row["node_id"]) == node_id and current is not None
        idgen = int(row["identity_generation"]) if row is not None else peer.identity_generation
        latest = await id_sql.latest_cert_serial(tx, node_id, idgen)
        facts = rules.CertFacts(
            known=known,
            session=row is not None and row["session_of"] is not None,
            attested=tpm_attest.ak_uri_of(cert) is not None,
            revoked=row is not None and row["revoked_at_ms"] is not None,
            not_after_ms=int(row["not_after_ms"]) if row is not None else 0,
            current_generation=current is not None and idgen == current == peer.identity_generation,
            latest=latest == serial,
        )
        verdict = rules.decide(facts, timestamp_ms, now_ms)
        if verdict != "issue":
            reason = "unknown-certificate" if verdict == "unknown" else verdict
            error = rules.refusal(verdict, node_id, serial, facts.not_after_ms, timestamp_ms - now_ms)
            raise Refused(f"session-cert:{reason}", error)
        not_after_ms = rules.session_not_after_ms(facts.not_after_ms, now_ms)
        try:
            issued = ca.issue_node_cert(
                csr,
                node_id,
                peer.role,
                idgen,
                rules.SESSION_MAX_TTL_S,
                session_of=serial,
                not_after=not_after_ms / 1000,
            )
        except (Unauthenticated, UsageError) as e:  # not P-256, or nothing left of the node certificate
            raise Refused("session-cert:bad-csr", e) from None
        pem = issued.public_bytes(serialization.Encoding.PEM)
        new_serial = format(issued.serial_number, "x")
        issued_not_after_ms = int(issued.not_valid_after_utc.timestamp() * 1000)
        await id_sql.insert_cert(
            tx,
            serial=new_serial,
            node_id=node_id,
            identity_generation=idgen,
            cert_pem=pem.decode(),
            issued_at_ms=now_ms,
            not_after_ms=issued_not_after_ms,
            session_of=serial,
        )
        await publish(
            tx,
            bus,
            "node.session-cert.issued",
            node_id,
            {"serial": new_serial, "session_of": serial, "not_after_ms": issued_not_after_ms},
            now_ms,
        )
    return SessionIssued(node_id, new_serial, serial, pem, issued_not_after_ms)
