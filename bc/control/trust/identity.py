"""Join tokens, joining and renewal: a one-time token becomes a node certificate, renewed before it expires.

The token's secret derives a key (`bc.pki.tokens.derive_token_key`); the server
keeps only the secret's hash and that key's public half (a self-signed
certificate, `root_cert_pem`). The joining node proves the token inside the
Join request: a signature by that key over the token id and its CSR
(`bc.pki.tokens.join_proof`), checked here before anything else is said about
the token. The TLS handshake before it only needs a leaf under the install's
one join root, which proves nothing, so every refusal (unknown, wrong secret,
used, expired) reaches the node as a sentence. Joining consumes the token in
the same transaction that records the certificate: a token works once.

Renewal (`renew`) is called over mutual TLS with the node's current
certificate and proves possession of the current key (`bc.pki.renewal`); the
new certificate certifies a new key for the same node, role and identity
generation. A TPM identity renews by proof (`renew_by_proof`): its key cannot
make a TLS handshake, so the certificate comes in the request and the proof
binds it; the checks are the same. Earlier certificates stay valid until they expire: a node that
crashed before storing its new certificate renews again with the old one.
"""

from __future__ import annotations

import logging
import random
import re
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.types import CertificatePublicKeyTypes

from bc.control.base.bus import Bus
from bc.control.base.events import publish
from bc.control.nodes.specs import write_spec
from bc.control.signing.signer import Signer
from bc.control.trust import ssh as ssh_ctl
from bc.errors import BcError, Unauthenticated, UsageError
from bc.pki import renewal as pki_renewal
from bc.pki import tokens as pki_tokens
from bc.pki import tpm_attest
from bc.pki.ca import NODE_MAX_TTL_S, RAMDISK_MAX_TTL_S, CertificateAuthority
from bc.pki.identity import PeerIdentity, peer_identity
from bc.pki.secrets_source import Secrets
from bc.pki.session_cert import session_of
from bc.pki.tpm_attest import TpmCertification
from bc.seams.clock import Clock
from bc.store import Store, Tx
from bc.store import identity as id_sql
from bc.store import nodes as nodes_sql
from bc.store.base import Row

NODE_ID = re.compile(r"[a-z0-9][a-z0-9._-]{0,62}")
ROLES = ("node", "site", "ramdisk")
MIN_TTL_S, MAX_TTL_S = 60, 7 * 24 * 3600
NODE_CERT_TTL_S = 24 * 3600
RAMDISK_MIN_LEFT_S = 60
"""A ramdisk renewal with less of its 2 h left than this is refused: the certificate would be over at once."""

log = logging.getLogger("bc.control.trust.identity")


def check_node_id(node_id: str) -> None:
    if not NODE_ID.fullmatch(node_id):
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
    store: Store,
    bus: Bus,
    ca: CertificateAuthority,
    clock: Clock,
    node_id: str,
    role: str,
    ttl_s: float,
    *,
    rng: random.Random,
    secrets: Secrets,
) -> IssuedToken:
    """A one-time token: its id from `rng` (a public name), its secret from `secrets`."""
    mint = TokenMint(ca.fingerprint, clock, secrets)
    now_ms = await store.now_ms()
    async with store.transaction() as tx:
        return await mint(tx, bus, rng, node_id, role, ttl_s, now_ms)


@dataclass(frozen=True)
class TokenMint:
    """Makes a join token inside the caller's transaction: `create_token`'s, and a provisioning job's (the
    ramdisk's token in its boot lease, the installed OS's on its kexec command line; docs/metal.md). It needs
    the CA's fingerprint only (the token pins it), never its key."""

    ca_fingerprint: str
    clock: Clock
    secrets: Secrets

    async def __call__(
        self, tx: Tx, bus: Bus | None, rng: random.Random, node_id: str, role: str, ttl_s: float, now_ms: int
    ) -> IssuedToken:
        check_node_id(node_id)
        if role not in ROLES:
            raise UsageError(f"unknown role {role!r}; roles are {', '.join(ROLES)}")
        if not MIN_TTL_S <= ttl_s <= MAX_TTL_S:
            raise UsageError(f"a token's ttl must be between 1m and 7d, not {ttl_s:.0f}s")
        new = pki_tokens.create_token(self.ca_fingerprint, ttl_s, self.clock, rng, self.secrets)
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
        return IssuedToken(new.token, new.token_id, node_id, role, int(new.expires_at * 1000))


@dataclass(frozen=True)
class Joined:
    node_id: str
    role: str
    cert_pem: bytes
    identity_generation: int


async def join(
    store: Store,
    bus: Bus,
    signer: Signer,
    ca: CertificateAuthority,
    token_id: str,
    csr_der: bytes,
    hostname: str,
    *,
    proof: bytes,
    ttl_s: int = NODE_CERT_TTL_S,
    tpm: TpmCertification | None = None,
    endorsed: bool = False,
) -> Joined:
    """Consume the token and issue the node's certificate (`ttl_s`, at most 24 h) for the key in the CSR.

    `proof` is the token key's signature over the token id and `csr_der` (`bc.pki.tokens.join_proof`); it
    is checked before the token's state, so only the token's holder learns that it was used or expired.
    With `tpm` (`bc join --attestor tpm`), the CSR's key must be one the TPM's attestation key certifies, and
    the certificate names that AK (`bc.pki.tpm_attest`): from then on the node renews only with next keys it
    certifies. `endorsed`: the AK was activated against the TPM's EK certificate first (`bc.pki.tpm_ek`), which
    the `node.joined` event says.
    """
    csr = _csr(csr_der)
    now_ms = await store.now_ms()
    async with store.transaction() as tx:
        tok = await _usable_token(tx, token_id, csr_der, proof, now_ms)
        ak = tpm_attest.check_tpm_key(tpm, csr.public_key()) if tpm is not None else ""
        if not await id_sql.use_token(tx, token_id, now_ms):
            raise Unauthenticated("the join token is no longer valid")
        node_id, role = str(tok["node_id"]), str(tok["role"])
        created = await nodes_sql.ensure(tx, node_id, role, now_ms)
        idgen = 1 if created else await id_sql.bump_identity_generation(tx, node_id)
        revived = not created and await nodes_sql.revive(tx, node_id, now_ms)  # a deleted id, history kept
        cert = ca.issue_node_cert(csr, node_id, role, idgen, node_cert_ttl(ttl_s), ak_uri=ak)
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
            await write_spec(tx, bus, signer, node_id, lambda spec: None, now_ms, lock=store.for_update())
        if created or revived:  # the SSH CA and the revoked serials, once `bc ssh ca init` made a CA
            await ssh_ctl.sync_access(tx, bus, signer, now_ms, [node_id], lock=store.for_update())
        await publish(
            tx,
            bus,
            "node.joined",
            node_id,
            {
                "role": role,
                "identity_generation": idgen,
                "revived": revived,
                "hostname": hostname,
                "serial": format(cert.serial_number, "x"),
                "attestor": "tpm" if ak else "",
                # a TPM join's only (a file-key join's event, and so every simulated fleet's digest, is unchanged)
                **({"endorsement": "activated" if endorsed else ""} if ak else {}),
            },
            now_ms,
        )
    return Joined(node_id, role, pem, idgen)


async def check_join(store: Store, token_id: str, csr_der: bytes, proof: bytes, tpm: TpmCertification) -> None:
    """What `join` checks before the TPM activation's challenge is given (nothing is consumed): the token, its
    proof, and the AK's certification of the CSR's key; each refusal `join`'s own sentence."""
    csr = _csr(csr_der)
    now_ms = await store.now_ms()
    async with store.transaction() as tx:
        await _usable_token(tx, token_id, csr_der, proof, now_ms)
    tpm_attest.check_tpm_key(tpm, csr.public_key())


def _csr(csr_der: bytes) -> x509.CertificateSigningRequest:
    try:
        return x509.load_der_x509_csr(csr_der)
    except ValueError:
        raise UsageError("the join request's CSR does not parse") from None


async def _usable_token(tx: Tx, token_id: str, csr_der: bytes, proof: bytes, now_ms: int) -> Row:
    """The token's row, once its proof holds (checked first, so only its holder learns its state), unused, unexpired."""
    tok = await id_sql.get_token(tx, token_id)
    if tok is None:
        raise Unauthenticated("the join token is unknown to this server; create a new one with `bc token create`")
    if not pki_tokens.verify_join_proof(str(tok["root_cert_pem"]).encode(), token_id, csr_der, proof):
        raise Unauthenticated(
            "the join token's secret does not match this server's record of it; check that the whole token was"
            " copied, or create a new one with `bc token create`"
        )
    if tok["used_at_ms"] is not None:
        raise Unauthenticated("the join token has already been used; create a new one with `bc token create`")
    if int(tok["expires_at_ms"]) <= now_ms:
        raise Unauthenticated("the join token has expired; create a new one with `bc token create`")
    return tok


def node_cert_ttl(ttl_s: int) -> int:
    """A node certificate's lifetime: `bc serve --node-cert-ttl` (tests shorten it), never above 24 h."""
    if ttl_s <= 0:
        raise UsageError(f"a node certificate's lifetime must be positive, not {ttl_s} s")
    return min(int(ttl_s), NODE_MAX_TTL_S)


@dataclass(frozen=True)
class Renewed:
    node_id: str
    serial: str
    cert_pem: bytes
    not_after_ms: int


class Refused(Exception):
    """A renewal (a re-join, a session certificate) refused after the caller proved its key: published, then
    raised as `error`."""

    def __init__(self, reason: str, error: BcError) -> None:
        super().__init__(error.message)
        self.reason, self.error = reason, error

    async def record(self, store: Store, bus: Bus, what: str, peer: PeerIdentity, now_ms: int) -> BcError:
        """Log and publish `security.<what>.refused` naming the node, in a transaction of its own (the
        request's rolled back); the error to raise."""
        log.warning(
            "event=%s.refused node=%s serial=%s reason=%s error=%s",
            what,
            peer.name,
            peer.serial,
            self.reason,
            self.error.message,
        )
        async with store.transaction() as tx:
            data = {"reason": self.reason, "serial": peer.serial, "message": self.error.message}
            await publish(tx, bus, f"security.{what}.refused", peer.name, data, now_ms)
        return self.error


async def renew(
    store: Store,
    bus: Bus,
    ca: CertificateAuthority,
    caller_cert: x509.Certificate,
    csr_der: bytes,
    timestamp_ms: int,
    proof: bytes,
    *,
    ttl_s: int = NODE_CERT_TTL_S,
    tpm: TpmCertification | None = None,
) -> Renewed:
    """Issue a node a certificate for a new key, proved by its current one (`caller_cert`, from mutual TLS).

    Refused (`Unauthenticated` unless said otherwise) when the caller is not a
    node certificate of this CA, the proof was not made by the caller's key,
    and, once the proof verified (each such refusal publishes
    `security.renew.refused` naming the node with the reason):
    `renew:stale-timestamp` (more than 60 s from the store clock),
    `renew:bad-csr` (`UsageError`: unreadable, or its signature does not
    match its key), `renew:key-reused` (`UsageError`: the CSR keeps the
    current key; a renewal rotates it), `renew:unknown-certificate`,
    `renew:revoked`, `renew:expired`, `renew:old-identity` (a certificate of
    an identity generation a later join replaced), and for a certificate that names a TPM attestation key
    (`tpm_key_for`): `renew:key-attestation-missing`, `renew:key-attestation-invalid`,
    `renew:attestor-changed`, and `renew:session-certificate` (a session certificate, `bc.pki.session_cert`,
    renews nothing: it would turn a day's in-memory key into an identity).
    """
    peer = peer_identity(caller_cert, ca.certificate)
    if peer.kind != "node":
        raise Unauthenticated(f"renewal needs a node certificate, not a {peer.kind} one")
    # Before the proof verifies, the caller has shown nothing worth an event: refuse quietly.
    pki_renewal.verify_renew_proof(caller_cert, csr_der, timestamp_ms, proof)
    return await _renew_published(store, bus, ca, peer, caller_cert, csr_der, timestamp_ms, ttl_s, tpm)


async def renew_by_proof(
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
    """`renew` for a certificate carried in the request rather than by TLS (a key the TPM holds cannot make a
    handshake): the proof binds the certificate (`bc.pki.renewal.renew_by_proof_message`); the rest is a
    renewal's, refusals and events included. The certificate's dates are judged from the store (`renew:expired`)."""
    try:
        cert = x509.load_der_x509_certificate(cert_der)
    except ValueError:
        raise UsageError("the renewal's certificate does not parse") from None
    peer = peer_identity(cert, ca.certificate)
    if peer.kind != "node":
        raise Unauthenticated(f"renewal needs a node certificate, not a {peer.kind} one")
    pki_renewal.verify_renew_by_proof(cert, cert_der, csr_der, timestamp_ms, nonce, proof)
    return await _renew_published(store, bus, ca, peer, cert, csr_der, timestamp_ms, ttl_s, tpm)


async def _renew_published(
    store: Store,
    bus: Bus,
    ca: CertificateAuthority,
    peer: PeerIdentity,
    caller_cert: x509.Certificate,
    csr_der: bytes,
    timestamp_ms: int,
    ttl_s: int,
    tpm: TpmCertification | None,
) -> Renewed:
    """The renewal once its proof verified: every refusal from here on publishes `security.renew.refused`."""
    now_ms = await store.now_ms()
    try:
        renewed = await _renew_proved(store, bus, ca, peer, caller_cert, csr_der, timestamp_ms, now_ms, ttl_s, tpm)
    except Refused as r:
        raise await r.record(store, bus, "renew", peer, now_ms) from None
    log.info("event=node.cert.renewed node=%s serial=%s previous=%s", peer.name, renewed.serial, peer.serial)
    return renewed


async def _renew_proved(
    store: Store,
    bus: Bus,
    ca: CertificateAuthority,
    peer: PeerIdentity,
    caller_cert: x509.Certificate,
    csr_der: bytes,
    timestamp_ms: int,
    now_ms: int,
    ttl_s: int,
    tpm: TpmCertification | None,
) -> Renewed:
    node_id, serial = peer.name, peer.serial
    try:
        pki_renewal.check_proof_timestamp(timestamp_ms, now_ms)
    except Unauthenticated as e:
        raise Refused("renew:stale-timestamp", e) from None
    refuse_session_cert(caller_cert, node_id, serial, "renew")
    csr = renewal_csr(csr_der, caller_cert, "renew")
    ak = tpm_key_for(caller_cert, csr, tpm, "renew")
    async with store.transaction() as tx:
        row = await id_sql.get_cert(tx, serial)
        if row is None or str(row["node_id"]) != node_id:
            raise Refused(
                "renew:unknown-certificate",
                Unauthenticated(f"certificate {serial} is not a certificate of node {node_id}"),
            )
        if row["revoked_at_ms"] is not None:
            raise Refused(
                "renew:revoked", Unauthenticated(f"certificate {serial} of node {node_id} has been revoked; join again")
            )
        if int(row["not_after_ms"]) <= now_ms:
            raise Refused(
                "renew:expired", Unauthenticated(f"certificate {serial} of node {node_id} has expired; join again")
            )
        idgen = int(row["identity_generation"])
        current = await id_sql.node_identity_generation(tx, node_id)
        if current is None or idgen != current or peer.identity_generation != idgen:
            raise Refused(
                "renew:old-identity",
                Unauthenticated(
                    f"certificate {serial} belongs to an older identity of node {node_id} (generation {idgen},"
                    f" now {current}); join again"
                ),
            )
        pem, new_serial, not_after_ms = await issue_and_store(
            tx, ca, csr, node_id, peer.role, idgen, ttl_s, ak, now_ms, "renew"
        )
        await publish(
            tx,
            bus,
            "node.cert.renewed",
            node_id,
            {"serial": new_serial, "not_after_ms": not_after_ms, "previous_serial": serial},
            now_ms,
        )
    return Renewed(node_id, new_serial, pem, not_after_ms)


async def issue_and_store(
    tx: Tx,
    ca: CertificateAuthority,
    csr: x509.CertificateSigningRequest,
    node_id: str,
    role: str,
    idgen: int,
    ttl_s: int,
    ak: str,
    now_ms: int,
    what: str,
) -> tuple[bytes, str, int]:
    """Issue the node's next certificate for a renewal or re-join (`what`: "renew" or "rejoin") and store it in
    `tx`: its PEM, serial (hex) and not-after. A CSR key that is not P-256 is refused as `<what>:bad-csr`.

    A ramdisk's identity lasts `RAMDISK_MAX_TTL_S` (2 h) from its join, renewals included: each renewal
    ends no later than that, and one asked for with less than `RAMDISK_MIN_LEFT_S` of it left is refused
    `<what>:ramdisk-lifetime`. A ramdisk that outlives its boot lease joins again with a new token."""
    not_after: float | None = None
    if role == "ramdisk":
        joined_ms = await id_sql.identity_issued_at_ms(tx, node_id, idgen)
        end_ms = (joined_ms if joined_ms is not None else now_ms) + RAMDISK_MAX_TTL_S * 1000
        if end_ms - now_ms < RAMDISK_MIN_LEFT_S * 1000:
            raise Refused(
                f"{what}:ramdisk-lifetime",
                Unauthenticated(
                    f"the ramdisk identity of node {node_id} ends {RAMDISK_MAX_TTL_S // 3600} h after its join and"
                    " is not renewed past that; join again with a new token"
                ),
            )
        not_after = end_ms / 1000
    try:
        cert = ca.issue_node_cert(csr, node_id, role, idgen, node_cert_ttl(ttl_s), ak_uri=ak, not_after=not_after)
    except Unauthenticated as e:
        raise Refused(f"{what}:bad-csr", e) from None
    pem = cert.public_bytes(serialization.Encoding.PEM)
    serial = format(cert.serial_number, "x")
    not_after_ms = int(cert.not_valid_after_utc.timestamp() * 1000)
    await id_sql.insert_cert(
        tx,
        serial=serial,
        node_id=node_id,
        identity_generation=idgen,
        cert_pem=pem.decode(),
        issued_at_ms=now_ms,
        not_after_ms=not_after_ms,
    )
    return pem, serial, not_after_ms


def refuse_session_cert(cert: x509.Certificate, node_id: str, serial: str, what: str) -> None:
    """A session certificate (`bc.pki.session_cert`) renews and re-joins nothing (`what`: "renew" or "rejoin"):
    its key lives in memory for a day at most, and certifying another key with it would make that an identity
    without the TPM."""
    if session_of(cert) is not None:
        words = "renewed" if what == "renew" else "re-joined"
        raise Refused(
            f"{what}:session-certificate",
            Unauthenticated(
                f"certificate {serial} of node {node_id} is a session certificate, which is never {words}; the node"
                " certificate whose key the TPM holds is"
            ),
        )


def renewal_csr(csr_der: bytes, current: x509.Certificate, what: str) -> x509.CertificateSigningRequest:
    """The CSR of a renewal or re-join (`what`: "renew" or "rejoin"), refused when it does not parse, its
    signature does not match its key, or it keeps the current certificate's key (both rotate the key)."""
    words = "renewal" if what == "renew" else "re-join"
    try:
        csr = x509.load_der_x509_csr(csr_der)
    except ValueError:
        raise Refused(f"{what}:bad-csr", UsageError(f"the {words}'s CSR does not parse")) from None
    if not csr.is_signature_valid:
        raise Refused(f"{what}:bad-csr", UsageError(f"the {words}'s CSR signature does not match its key"))
    if _spki(csr.public_key()) == _spki(current.public_key()):
        raise Refused(
            f"{what}:key-reused",
            UsageError(f"the {words}'s CSR reuses the current key; a {words} must certify a new key"),
        )
    return csr


def tpm_key_for(
    current: x509.Certificate, csr: x509.CertificateSigningRequest, tpm: TpmCertification | None, what: str
) -> str:
    """The AK URI the next certificate names ("" for none): a certificate that names an AK renews (or
    re-joins) only with a CSR key that AK certifies; one that names none cannot gain one this way."""
    named = tpm_attest.ak_uri_of(current)
    words = "renewal" if what == "renew" else "re-join"
    if named is None:
        if tpm is not None:
            raise Refused(
                f"{what}:attestor-changed",
                UsageError(
                    f"a {words} keeps the node's attestor; to hold the key in a TPM, join again:"
                    " bc join --reset --yes --attestor tpm"
                ),
            )
        return ""
    if tpm is None:
        raise Refused(
            f"{what}:key-attestation-missing",
            Unauthenticated(
                f"the certificate names a TPM attestation key, so a {words} needs the next key certified by it"
            ),
        )
    try:
        return tpm_attest.check_tpm_key(tpm, csr.public_key(), named)
    except Unauthenticated as e:
        raise Refused(f"{what}:key-attestation-invalid", e) from None


def _spki(key: CertificatePublicKeyTypes) -> bytes:
    """A public key's DER SubjectPublicKeyInfo: the one comparison that holds across key classes."""
    return key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
