"""Join.Rejoin: a node whose certificate expired while it was offline gets a new one with its old key.

The rule is `bc.pki.rejoin.decide` (pure; its module docstring has the table
and the proof's bytes). Here the server checks everything, in this order:

1. the certificate is this CA's, for a node (`peer_identity` without dates: it has expired);
2. the proof verifies with the certificate's key over this certificate, CSR, timestamp and nonce; until
   it does the caller has shown nothing, and is refused without an event;
3. then, each refusal publishing `security.rejoin.refused` naming the node with its reason: the
   timestamp within 60 s of the store clock (`rejoin:stale-timestamp`), the CSR (`rejoin:bad-csr`,
   `rejoin:key-reused`), and, with the node's row locked, `decide` over what the store holds about the
   certificate (`rejoin:revoked`, `rejoin:too-late`, `rejoin:not-latest`, `rejoin:old-identity`,
   `rejoin:unknown-certificate`, `rejoin:not-expired`), and for a certificate naming a TPM attestation key,
   a next key it certifies, as a renewal (`tpm_key_for`); a session certificate never re-joins
   (`rejoin:session-certificate`, `bc.pki.session_cert`).

Success issues a certificate for the CSR's key, of the same node, role and identity generation (the
node keeps its id, labels and journal), and publishes `node.rejoined`.
"""

from __future__ import annotations

import logging

from cryptography import x509

from bc.control.base.bus import Bus
from bc.control.base.events import publish
from bc.control.trust.identity import (
    NODE_CERT_TTL_S,
    Refused,
    Renewed,
    issue_and_store,
    refuse_session_cert,
    renewal_csr,
    tpm_key_for,
)
from bc.errors import Unauthenticated, UsageError
from bc.pki import rejoin as rules
from bc.pki import renewal as pki_renewal
from bc.pki.ca import CertificateAuthority
from bc.pki.identity import PeerIdentity, peer_identity
from bc.pki.tpm_attest import TpmCertification
from bc.store import Store
from bc.store import identity as id_sql

log = logging.getLogger("bc.control.trust.rejoin")


async def rejoin(
    store: Store,
    bus: Bus,
    ca: CertificateAuthority,
    cert_der: bytes,
    csr_der: bytes,
    timestamp_ms: int,
    nonce: bytes,
    proof: bytes,
    *,
    ttl_s: int = NODE_CERT_TTL_S,
    tpm: TpmCertification | None = None,
) -> Renewed:
    """A new certificate for an expired one's node, proved by the expired certificate's key (see above)."""
    try:
        cert = x509.load_der_x509_certificate(cert_der)
    except ValueError:
        raise UsageError("the re-join's certificate does not parse") from None
    peer = peer_identity(cert, ca.certificate)  # no `now`: its dates are `decide`'s to judge, in store time
    if peer.kind != "node":
        raise Unauthenticated(f"a re-join needs a node certificate, not a {peer.kind} one")
    rules.verify_rejoin_proof(cert, cert_der, csr_der, timestamp_ms, nonce, proof)
    now_ms = await store.now_ms()
    try:
        renewed = await _rejoin_proved(store, bus, ca, peer, cert, csr_der, timestamp_ms, now_ms, ttl_s, tpm)
    except Refused as r:
        raise await r.record(store, bus, "rejoin", peer, now_ms) from None
    log.info("event=node.rejoined node=%s serial=%s previous=%s", peer.name, renewed.serial, peer.serial)
    return renewed


async def _rejoin_proved(
    store: Store,
    bus: Bus,
    ca: CertificateAuthority,
    peer: PeerIdentity,
    cert: x509.Certificate,
    csr_der: bytes,
    timestamp_ms: int,
    now_ms: int,
    ttl_s: int,
    tpm: TpmCertification | None,
) -> Renewed:
    node_id, serial = peer.name, peer.serial
    try:
        pki_renewal.check_proof_timestamp(timestamp_ms, now_ms, "re-join")
    except Unauthenticated as e:
        raise Refused("rejoin:stale-timestamp", e) from None
    refuse_session_cert(cert, node_id, serial, "rejoin")
    csr = renewal_csr(csr_der, cert, "rejoin")
    ak = tpm_key_for(cert, csr, tpm, "rejoin")
    async with store.transaction() as tx:
        current = await id_sql.lock_node_identity(tx, node_id)
        row = await id_sql.get_cert(tx, serial)
        known = row is not None and str(row["node_id"]) == node_id
        idgen = int(row["identity_generation"]) if row is not None else peer.identity_generation
        latest = await id_sql.latest_cert_serial(tx, node_id, idgen)
        facts = rules.CertFacts(
            known=known and current is not None,
            revoked=row is not None and row["revoked_at_ms"] is not None,
            # The stored date, which is the certificate's own (the CA wrote both).
            not_after_ms=int(row["not_after_ms"]) if row is not None else 0,
            current_generation=current is not None and idgen == current == peer.identity_generation,
            latest=latest == serial,
        )
        verdict = rules.decide(facts, now_ms)
        if verdict != "rejoin":
            reason = "unknown-certificate" if verdict == "unknown" else verdict
            raise Refused(f"rejoin:{reason}", rules.refusal(verdict, node_id, serial, facts.not_after_ms))
        pem, new_serial, not_after_ms = await issue_and_store(
            tx, ca, csr, node_id, peer.role, idgen, ttl_s, ak, now_ms, "rejoin"
        )
        await publish(
            tx,
            bus,
            "node.rejoined",
            node_id,
            {
                "serial": new_serial,
                "not_after_ms": not_after_ms,
                "previous_serial": serial,
                "expired_for_s": (now_ms - facts.not_after_ms) // 1000,
            },
            now_ms,
        )
    return Renewed(node_id, new_serial, pem, not_after_ms)
