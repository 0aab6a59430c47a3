"""A keyless gateway's serving certificate: what it asks for and when it asks again (pure rules).

A gateway-only `bc serve` makes its own P-256 key (kept in its data dir,
0600), writes a CSR for the hosts it serves into the store, and serves once
an api process (the one holding the CA) has issued the certificate there. The
certificate lives 30 days and is asked for again at 60 % of its life, the same
way, with the same key; the gateway swaps it in without a restart.
"""

from __future__ import annotations

import json

from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from bc.errors import UsageError

SERVING_CERT_TTL_S = 30 * 24 * 3600
RENEW_AT = 0.6
MAX_HOSTS = 32
WAIT_LOG = "waiting for an api process (bc serve --roles api) to issue this gateway's serving certificate"


def gateway_hosts(listen_host: str, advertise: list[str]) -> list[str]:
    """The names a gateway's certificate covers: its --listen host (unless a wildcard) and its --advertise names.

    The loopback names are always added by the CA; an --advertise entry may be HOST or HOST:PORT.
    """
    out: list[str] = []
    for h in [listen_host, *advertise]:
        host = h.strip()
        if host.count(":") == 1:  # HOST:PORT (an IPv6 address has more colons, or brackets)
            host = host.split(":")[0]
        host = host.strip("[]")
        if host and host not in ("0.0.0.0", "::") and host not in out:
            out.append(host)
    if len(out) > MAX_HOSTS:
        raise UsageError(f"a gateway's certificate covers at most {MAX_HOSTS} names, not {len(out)}")
    return out


def encode_hosts(hosts: list[str]) -> str:
    return json.dumps(hosts)


def decode_hosts(text: str) -> list[str]:
    v = json.loads(text or "[]")
    if not isinstance(v, list) or not all(isinstance(h, str) for h in v) or len(v) > MAX_HOSTS:
        raise UsageError("a stored serving-certificate request names its hosts badly")
    return [str(h) for h in v]


def make_csr(key: ec.EllipticCurvePrivateKey, gateway_id: str) -> x509.CertificateSigningRequest:
    """The request: the CA keeps only its key (and checks its signature); the hosts travel beside it."""
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"gateway:{gateway_id}")])
    return x509.CertificateSigningRequestBuilder().subject_name(name).sign(key, hashes.SHA256())


def renew_at(not_before: float, not_after: float) -> float:
    """When to ask again: at 60 % of the certificate's life."""
    return not_before + RENEW_AT * (not_after - not_before)


def needs_request(
    cert: x509.Certificate | None, key: ec.EllipticCurvePublicKey, hosts: list[str], stored_hosts: list[str], now: float
) -> bool:
    """Whether to (re)write the request: no certificate yet, one for another key or other hosts, or one past
    60 % of its life."""
    if cert is None or cert.public_key() != key or sorted(hosts) != sorted(stored_hosts):
        return True
    return now >= renew_at(cert.not_valid_before_utc.timestamp(), cert.not_valid_after_utc.timestamp())


def usable(cert: x509.Certificate, key: ec.EllipticCurvePublicKey, now: float) -> bool:
    """A certificate the gateway can serve with: for its key, and not expired."""
    return cert.public_key() == key and now < cert.not_valid_after_utc.timestamp()
