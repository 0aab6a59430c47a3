"""The cluster CA: one P-256 key on the `bc serve` host that signs every identity.

`load_or_create(dir, clock)` keeps `ca.key` (0600) and `ca.crt` in `dir`. It
never overwrites: a directory holding one file without the other, or a key
that does not match the certificate, is refused, because silently minting a
new CA would orphan every node that pinned the old one.

What the certificates say (and `bc.pki.identity` reads back):

* node: CN `node:<id>`, SAN URIs `urn:bc:node:<id>`, `urn:bc:role:<role>`,
  `urn:bc:idgen:<n>`; clientAuth; at most 24 h (2 h for the ramdisk role). The subject and extensions a
  CSR asks for are ignored: the node is who the CA says.
* operator: CN `operator:<name>`; clientAuth; 1 year.
* server: SAN of the given hosts plus 127.0.0.1, ::1 and localhost;
  serverAuth; 1 year.
* gateway (a keyless gateway's serving certificate, from its CSR in the store):
  CN `gateway:<id>`, SAN of its hosts plus the loopback names; serverAuth and
  clientAuth (it dials the api with it to proxy Renew); 30 days
  (`bc.pki.serving`).

Every validity window starts 60 s in the past to forgive small clock skew, and
all times come from the injected clock. Serials come from the injected Random,
the CA's key and its name's suffix from the injected `Secrets`.
"""

from __future__ import annotations

import ipaddress
import random
import re
from collections.abc import Sequence
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from bc.errors import Unauthenticated, UsageError
from bc.pki import join_answer, keys
from bc.pki.secrets_source import Secrets, p256_key
from bc.runtime.files import atomic_write
from bc.seams.clock import Clock

CA_KEY_FILE = "ca.key"
CA_CERT_FILE = "ca.crt"

CA_LIFETIME_S = 10 * 365 * 24 * 3600
LEAF_LIFETIME_S = 365 * 24 * 3600
NODE_MAX_TTL_S = 24 * 3600
RAMDISK_MAX_TTL_S = 2 * 3600
BACKDATE_S = 60

# Names end up in URIs and CNs that we parse back; keep them boring.
_NODE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_ROLE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_SERIAL = re.compile(r"[0-9a-f]{1,40}")
_OPERATOR = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@+-]{0,127}")

_ALWAYS_HOSTS = ("127.0.0.1", "::1", "localhost")


def _check_name(what: str, value: str, pattern: re.Pattern[str]) -> None:
    if not pattern.fullmatch(value):
        raise UsageError(
            f"the {what} {value!r} is not valid: use letters, digits, '.', '_' or '-' (starting with a letter or digit)"
        )


def _host_names(hosts: list[str]) -> list[x509.GeneralName]:
    """SAN entries for `hosts` (IP addresses or DNS names) and the loopback names, each once."""
    names: list[x509.GeneralName] = []
    seen: set[str] = set()
    for host in [*hosts, *_ALWAYS_HOSTS]:
        host = host.strip().strip("[]")
        if not host or host.lower() in seen:
            continue
        seen.add(host.lower())
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host.lower()))
    return names


def _public(key: ec.EllipticCurvePrivateKey | ec.EllipticCurvePublicKey) -> ec.EllipticCurvePublicKey:
    pub = key.public_key() if isinstance(key, ec.EllipticCurvePrivateKey) else key
    if not keys.is_p256(pub):
        raise UsageError("certificates are issued only for ECDSA P-256 keys")
    return pub


class CertificateAuthority:
    """Signs server, node and operator certificates with the cluster CA key."""

    def __init__(
        self, key: ec.EllipticCurvePrivateKey, cert: x509.Certificate, clock: Clock, rng: random.Random
    ) -> None:
        if cert.public_key() != key.public_key():
            raise UsageError("the CA key does not match the CA certificate")
        self._key = key
        self._cert = cert
        self._clock = clock
        self._rng = rng  # serials

    # -- loading -----------------------------------------------------------------------------

    @classmethod
    def load_or_create(
        cls, dir: Path, clock: Clock, rng: random.Random, secrets: Secrets
    ) -> tuple[CertificateAuthority, bool]:
        """Load the CA from `dir`, or create it there if neither file exists; True if created."""
        dir = Path(dir)
        key_path, cert_path = dir / CA_KEY_FILE, dir / CA_CERT_FILE
        have_key, have_cert = key_path.exists(), cert_path.exists()
        if have_key and have_cert:
            key = keys.load_key_pem(key_path.read_bytes())
            cert = keys.load_cert_pem(cert_path.read_bytes())
            return cls(key, cert, clock, rng), False
        if have_key or have_cert:
            present, missing = (key_path, cert_path) if have_key else (cert_path, key_path)
            raise UsageError(
                f"the CA directory holds {present} but not {missing}; restore the missing file or move the "
                "directory aside (a new CA would cut off every joined node)"
            )
        ca = cls.create(clock, rng, secrets)
        # The key goes first: a crash between the two writes leaves a key without a certificate,
        # which the next start refuses loudly rather than replacing.
        keys.write_private_key(key_path, ca._key)
        atomic_write(cert_path, ca.ca_pem, mode=0o644)
        return ca, True

    @classmethod
    def create(cls, clock: Clock, rng: random.Random, secrets: Secrets) -> CertificateAuthority:
        """A new CA in memory (10 years); `load_or_create` is what persists it."""
        key = p256_key(secrets)
        now = clock.now()
        # The suffix tells two installs' CAs apart in a certificate viewer; drawn with the key, as it names it.
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"bc CA {secrets.token_hex(4)}")])
        pub = key.public_key()
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(pub)
            .serial_number(keys.serial_number(rng))
            .not_valid_before(keys.utc(now - BACKDATE_S))
            .not_valid_after(keys.utc(now + CA_LIFETIME_S))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=False,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(pub), critical=False)
            .sign(key, hashes.SHA256())
        )
        return cls(key, cert, clock, rng)

    # -- what others need to know --------------------------------------------------------------

    @property
    def certificate(self) -> x509.Certificate:
        return self._cert

    @property
    def ca_pem(self) -> bytes:
        return keys.cert_to_pem(self._cert)

    @property
    def fingerprint(self) -> str:
        return keys.fingerprint(self._cert)

    # -- issuing -------------------------------------------------------------------------------

    def issue_server_cert(
        self, hosts: list[str], key: ec.EllipticCurvePrivateKey | ec.EllipticCurvePublicKey
    ) -> x509.Certificate:
        """A serving certificate for `hosts` (IP addresses or DNS names), plus the loopback names."""
        cn = hosts[0].strip() if hosts and hosts[0].strip() else "localhost"
        builder = self._leaf(cn, _public(key), LEAF_LIFETIME_S, ExtendedKeyUsageOID.SERVER_AUTH)
        builder = builder.add_extension(x509.SubjectAlternativeName(_host_names(hosts)), critical=False)
        return builder.sign(self._key, hashes.SHA256())

    def issue_gateway_cert(
        self, csr: x509.CertificateSigningRequest, gateway_id: str, hosts: list[str], lifetime_s: float
    ) -> x509.Certificate:
        """A keyless gateway's serving (and api-client) certificate for the key in `csr`; only the key is used."""
        if not csr.is_signature_valid:
            raise Unauthenticated("the certificate request's signature does not match its key")
        pub = csr.public_key()
        if not isinstance(pub, ec.EllipticCurvePublicKey) or not keys.is_p256(pub):
            raise Unauthenticated("the certificate request's key is not an ECDSA P-256 key")
        _check_name("gateway id", gateway_id, _NODE_ID)
        builder = self._leaf(
            f"gateway:{gateway_id}",
            pub,
            lifetime_s,
            ExtendedKeyUsageOID.SERVER_AUTH,
            ExtendedKeyUsageOID.CLIENT_AUTH,
        )
        builder = builder.add_extension(x509.SubjectAlternativeName(_host_names(hosts)), critical=False)
        return builder.sign(self._key, hashes.SHA256())

    def issue_node_cert(
        self,
        csr: x509.CertificateSigningRequest,
        node_id: str,
        role: str,
        identity_generation: int,
        ttl_s: int = NODE_MAX_TTL_S,
        ak_uri: str = "",
        *,
        session_of: str = "",
        not_after: float | None = None,
    ) -> x509.Certificate:
        """A node's client certificate for the key in `csr`, at most 24 h long (a ramdisk's, 2 h).

        Only the CSR's public key is used, and only once its signature proves
        the requester holds the private half. `ak_uri` (`urn:bc:tpm-ak:…`) names the TPM attestation key
        that certified that key (`bc.pki.tpm_attest`), for a node that joined with `--attestor tpm`.
        `session_of` (a serial) makes it a session certificate of that node certificate
        (`urn:bc:session-of:<serial>`, `bc.pki.session_cert`); `not_after` (epoch seconds) ends it no later.
        """
        if not csr.is_signature_valid:
            raise Unauthenticated("the certificate request's signature does not match its key")
        pub = csr.public_key()
        if not isinstance(pub, ec.EllipticCurvePublicKey) or not keys.is_p256(pub):
            raise Unauthenticated("the certificate request's key is not an ECDSA P-256 key")
        _check_name("node id", node_id, _NODE_ID)
        if role:
            _check_name("role", role, _ROLE)
        if identity_generation < 0:
            raise UsageError(f"the identity generation must not be negative, got {identity_generation}")
        if ttl_s <= 0:
            raise UsageError(f"a node certificate's lifetime must be positive, got {ttl_s} s")
        uris = [f"urn:bc:node:{node_id}", f"urn:bc:idgen:{identity_generation}"]
        if role:
            uris.insert(1, f"urn:bc:role:{role}")
        if ak_uri:
            uris.append(ak_uri)
        if session_of:
            if not _SERIAL.fullmatch(session_of):
                raise UsageError(f"{session_of!r} is not a certificate serial (lowercase hex)")
            uris.append(f"urn:bc:session-of:{session_of}")
        cap = RAMDISK_MAX_TTL_S if role == "ramdisk" else NODE_MAX_TTL_S  # a ramdisk boots briefly: 2 h at most
        lifetime_s = float(min(ttl_s, cap))
        if not_after is not None:
            lifetime_s = min(lifetime_s, not_after - self._clock.now())
            if lifetime_s <= 0:
                raise UsageError("the certificate would end before it starts")
        builder = self._leaf(f"node:{node_id}", pub, lifetime_s, ExtendedKeyUsageOID.CLIENT_AUTH)
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.UniformResourceIdentifier(u) for u in uris]), critical=False
        )
        return builder.sign(self._key, hashes.SHA256())

    def issue_operator_cert(
        self, name: str, key: ec.EllipticCurvePrivateKey | ec.EllipticCurvePublicKey
    ) -> x509.Certificate:
        """An operator's client certificate for the Admin API (1 year)."""
        _check_name("operator name", name, _OPERATOR)
        builder = self._leaf(f"operator:{name}", _public(key), LEAF_LIFETIME_S, ExtendedKeyUsageOID.CLIENT_AUTH)
        return builder.sign(self._key, hashes.SHA256())

    def _leaf(
        self, cn: str, pub: ec.EllipticCurvePublicKey, lifetime_s: float, *eku: x509.ObjectIdentifier
    ) -> x509.CertificateBuilder:
        now = self._clock.now()
        not_after = min(now + lifetime_s, self._cert.not_valid_after_utc.timestamp())
        return (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
            .issuer_name(self._cert.subject)
            .public_key(pub)
            .serial_number(keys.serial_number(self._rng))
            .not_valid_before(keys.utc(now - BACKDATE_S))
            .not_valid_after(keys.utc(not_after))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=False,
                    crl_sign=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.ExtendedKeyUsage(list(eku)), critical=False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(pub), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self._ca_public_key()), critical=False)
        )

    def sign_join_answer(self, csr_der: bytes, cert_pem: bytes, trust: bytes, ssh_ca_keys: Sequence[str] = ()) -> bytes:
        """The CA key's signature over a join's answer (`bc.pki.join_answer`): what a node checks it by."""
        message = join_answer.answer_message(csr_der, cert_pem, trust, ssh_ca_keys)
        return self._key.sign(message, ec.ECDSA(hashes.SHA256()))

    def sign_activation_ticket(self, message: bytes) -> bytes:
        """The CA key's signature over a TPM activation's ticket (`bc.pki.tpm_ek.ticket_message`): the server's
        memory of a challenge, checked when the node comes back with the secret."""
        if not message.startswith(b"bc.v1/tpm-activation\n"):
            raise ValueError("the CA signs only TPM activation tickets here")
        return self._key.sign(message, ec.ECDSA(hashes.SHA256()))

    def _ca_public_key(self) -> ec.EllipticCurvePublicKey:
        return self._key.public_key()
