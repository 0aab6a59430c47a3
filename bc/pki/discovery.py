"""Fetch the cluster CA from a server we do not trust yet, and keep it only if it matches the pin.

A joining node has a token but no CA certificate. It opens one TLS
connection without verification, reads the chain the server presents (the
server sends its leaf followed by the CA, see `bc.wire.tls.ServerTLS`), and
keeps the certificate whose SHA-256 equals the token's pin, provided it is a
CA and signed the leaf. From then on every connection verifies against that
CA. A man in the middle can refuse service but cannot substitute its own CA.

This module blocks (a socket with a timeout); async callers run it with
`asyncio.to_thread(fetch_pinned_ca, ...)`.
"""

from __future__ import annotations

import socket
import ssl
from typing import Any

from cryptography import x509

from bc.errors import Unauthenticated, Unavailable
from bc.pki import keys


def fetch_pinned_ca(host: str, port: int, pin: str, timeout: float = 10) -> bytes:
    """The PEM of the CA the server at host:port presents, if its fingerprint is `pin`."""
    where = f"{host}:{port}"
    try:
        chain = [x509.load_der_x509_certificate(der) for der in _presented_chain(host, port, timeout, where)]
    except ValueError:
        raise Unauthenticated(f"the server at {where} presented a certificate that cannot be read") from None
    if not chain:
        raise Unauthenticated(f"the server at {where} presented no certificate")
    wanted = pin.strip().lower()
    for cert in chain:
        if keys.fingerprint(cert) != wanted:
            continue
        if not _is_ca(cert):
            raise Unauthenticated(f"the certificate pinned by the join token ({wanted}) is not a CA")
        try:
            chain[0].verify_directly_issued_by(cert)
        except Exception:
            raise Unauthenticated(
                f"the server at {where} presents the pinned CA but a certificate that CA did not issue"
            ) from None
        return keys.cert_to_pem(cert)
    raise Unauthenticated(
        f"the server's CA does not match the join token's pin (expected {wanted}); is this the right server?"
    )


def _presented_chain(host: str, port: int, timeout: float, where: str) -> list[bytes]:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE  # nothing to verify against yet: the pin is the check
    ctx.set_alpn_protocols(["h2"])
    try:
        with (
            socket.create_connection((host, port), timeout=timeout) as sock,
            ctx.wrap_socket(sock, server_hostname=host) as tls,
        ):
            return _unverified_chain_der(tls)
    except OSError as e:  # refused, unreachable, timed out, TLS failure (ssl.SSLError is an OSError)
        raise Unavailable(f"cannot reach the server at {where}: {e}") from None


def _unverified_chain_der(tls: ssl.SSLSocket) -> list[bytes]:
    """The presented chain as DER, leaf first.

    `SSLSocket.get_unverified_chain()` is public since 3.13 and returns DER
    bytes there; on 3.11/3.12 only the private `_sslobj` has it, returning
    `_ssl.Certificate` objects that we convert.
    """
    getter = getattr(tls, "get_unverified_chain", None)
    if getter is None:
        getter = tls._sslobj.get_unverified_chain  # type: ignore[attr-defined]
    chain: list[Any] = getter() or []
    der_format = ssl._ssl.ENCODING_DER  # type: ignore[attr-defined]
    return [c if isinstance(c, bytes) else c.public_bytes(der_format) for c in chain]


def _is_ca(cert: x509.Certificate) -> bool:
    try:
        return cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    except x509.ExtensionNotFound:
        return False
