"""Mutual TLS for the gRPC server and clients, with join-token roots that come and go.

The server trusts the cluster CA for client certificates, plus one root per
live join token (`bc.pki.tokens.token_root_cert`). Tokens are created and
used while the server runs, so its credentials are dynamic: grpc calls our
fetcher from its own thread at each new handshake, and we hand it a new
configuration only when the set of roots changed since it last asked.

The server presents its leaf followed by the CA certificate, so a joining
node can find the CA its token pins (`bc.pki.discovery`).

TLS accepting a certificate proves only that one of the trusted roots signed
it; handlers still call `bc.pki.identity.peer_identity` (node or operator,
signed by the CA itself) or `join_leaf_identity` on `peer_cert_from_context`.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

import grpc

if TYPE_CHECKING:
    from cryptography import x509

# bc.pki.keys (cryptography's x509, ~20 ms) is imported where a certificate is read: the CLI's client
# needs only `channel_credentials`, and every CLI call would pay for it.


class _HasAuthContext(Protocol):
    def auth_context(self) -> Mapping[str, Sequence[bytes]]: ...


class ServerTLS:
    """The server's key and chain, the CA, and the mutable set of join-token roots."""

    def __init__(
        self,
        key_pem: bytes,
        cert_pem: bytes,
        ca_pem: bytes,
        token_roots: Mapping[str, bytes] | None = None,
    ) -> None:
        """`cert_pem` is the server's leaf; the CA is appended to the chain it presents."""
        self._key_pem = key_pem
        self._chain_pem = _join_pem(cert_pem, ca_pem)
        self._ca_pem = ca_pem
        self._lock = threading.Lock()
        self._roots: dict[str, bytes] = dict(token_roots or {})
        self._version = 0

    def set_identity(self, key_pem: bytes, cert_pem: bytes) -> None:
        """Serve with a new key and leaf (a renewed serving certificate); the next handshake presents it."""
        from bc.pki import keys

        keys.load_cert_pem(cert_pem)
        with self._lock:
            self._key_pem = key_pem
            self._chain_pem = _join_pem(cert_pem, self._ca_pem)
            self._version += 1

    def set_token_roots(self, roots: Mapping[str, bytes]) -> None:
        """Replace every token root (at start, and every few seconds from the store's live tokens)."""
        new = dict(roots)
        with self._lock:
            held = dict(self._roots)
        for token_id, pem in new.items():
            if held.get(token_id) != pem:  # parsed once, when it arrives: not again at every refresh
                _check_pem(pem)
        with self._lock:
            if new != self._roots:
                self._roots = new
                self._version += 1

    def add_token_root(self, token_id: str, pem: bytes) -> None:
        """Trust leaves signed by this token's root (from token creation until it is used or expires)."""
        _check_pem(pem)
        with self._lock:
            if self._roots.get(token_id) != pem:
                self._roots[token_id] = pem
                self._version += 1

    def remove_token_root(self, token_id: str) -> None:
        """Stop trusting a token's root (used or expired); later handshakes with its leaves fail."""
        with self._lock:
            if self._roots.pop(token_id, None) is not None:
                self._version += 1

    def token_ids(self) -> set[str]:
        with self._lock:
            return set(self._roots)

    def credentials(self) -> grpc.ServerCredentials:
        """`grpc.ServerCredentials` requiring a client certificate from one of the trusted roots.

        Each call makes independent credentials with their own idea of what
        grpc last received, so one `ServerTLS` can serve several ports.
        """
        version, config = self._snapshot()
        last = [version]

        def fetch() -> grpc.ServerCertificateConfiguration | None:
            with self._lock:
                if self._version == last[0]:
                    return None
                last[0] = self._version
                return self._config_locked()

        return grpc.dynamic_ssl_server_credentials(config, fetch, require_client_authentication=True)

    def _snapshot(self) -> tuple[int, grpc.ServerCertificateConfiguration]:
        with self._lock:
            return self._version, self._config_locked()

    def _config_locked(self) -> grpc.ServerCertificateConfiguration:
        roots = _join_pem(self._ca_pem, *(self._roots[t] for t in sorted(self._roots)))
        return grpc.ssl_server_certificate_configuration([(self._key_pem, self._chain_pem)], root_certificates=roots)


def channel_credentials(ca_pem: bytes, key_pem: bytes, cert_pem: bytes) -> grpc.ChannelCredentials:
    """`grpc.ChannelCredentials` that trust only `ca_pem` and present `cert_pem` with `key_pem`."""
    return grpc.ssl_channel_credentials(root_certificates=ca_pem, private_key=key_pem, certificate_chain=cert_pem)


def peer_cert_from_context(context: _HasAuthContext) -> x509.Certificate | None:
    """The client certificate of the call (`grpc.ServicerContext` or `grpc.aio.ServicerContext`)."""
    pems = context.auth_context().get("x509_pem_cert")
    if not pems:
        return None
    from bc.pki import keys

    return keys.load_cert_pem(pems[0])


def _check_pem(pem: bytes) -> None:
    # One unreadable root would make grpc reject the whole configuration, and with it every handshake.
    from bc.pki import keys

    keys.load_cert_pem(pem)


def _join_pem(*pems: bytes) -> bytes:
    return b"".join(p if p.endswith(b"\n") else p + b"\n" for p in pems)
