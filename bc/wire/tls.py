"""Mutual TLS for the gRPC server and clients.

The server trusts two roots for client certificates, fixed for the life of
the CA: the cluster CA, and the install's one join root
(`bc.pki.tokens.join_root_cert`), which every process derives from the CA
certificate alone, byte for byte. Join tokens never reach the TLS layer (the
token is proven inside the Join request), so the configuration grpc holds
changes only when this process's serving certificate is renewed
(`set_identity`): grpc calls our fetcher from its own thread at each new
handshake, and we hand it a new configuration only then.

The server presents its leaf followed by the CA certificate, so a joining
node can find the CA its token pins (`bc.pki.discovery`).

TLS accepting a certificate proves only that one of the two roots signed it,
and the join root's key is public; handlers still call
`bc.pki.identity.peer_identity` (node, operator or gateway, signed by the CA
itself) or `join_leaf_identity` on `peer_cert_from_context`.
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
    """The server's key and chain, and the client roots: the CA and the join root derived from it."""

    def __init__(self, key_pem: bytes, cert_pem: bytes, ca_pem: bytes) -> None:
        """`cert_pem` is the server's leaf; the CA is appended to the chain it presents."""
        from bc.pki import keys, tokens

        self._key_pem = key_pem
        self._chain_pem = _join_pem(cert_pem, ca_pem)
        self._ca_pem = ca_pem
        self.join_root_pem = tokens.join_root_pem(keys.fingerprint(keys.load_cert_pem(ca_pem)))
        self._client_roots = _join_pem(ca_pem, self.join_root_pem)
        self._lock = threading.Lock()
        self._version = 0

    def set_identity(self, key_pem: bytes, cert_pem: bytes) -> None:
        """Serve with a new key and leaf (a renewed serving certificate); the next handshake presents it."""
        from bc.pki import keys

        keys.load_cert_pem(cert_pem)
        with self._lock:
            self._key_pem = key_pem
            self._chain_pem = _join_pem(cert_pem, self._ca_pem)
            self._version += 1

    def credentials(self) -> grpc.ServerCredentials:
        """`grpc.ServerCredentials` requiring a client certificate from the CA or the join root.

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
        return grpc.ssl_server_certificate_configuration(
            [(self._key_pem, self._chain_pem)], root_certificates=self._client_roots
        )


def channel_credentials(ca_pem: bytes, key_pem: bytes, cert_pem: bytes) -> grpc.ChannelCredentials:
    """`grpc.ChannelCredentials` that trust only `ca_pem` and present `cert_pem` with `key_pem`."""
    return grpc.ssl_channel_credentials(root_certificates=ca_pem, private_key=key_pem, certificate_chain=cert_pem)


def peer_pem_from_context(context: _HasAuthContext) -> bytes | None:
    """The client certificate of the call as grpc hands it over, PEM (`grpc.ServicerContext` or the aio one)."""
    pems = context.auth_context().get("x509_pem_cert")
    return pems[0] if pems else None


def peer_cert_from_context(context: _HasAuthContext) -> x509.Certificate | None:
    """The client certificate of the call (`grpc.ServicerContext` or `grpc.aio.ServicerContext`)."""
    pem = peer_pem_from_context(context)
    if pem is None:
        return None
    from bc.pki import keys

    return keys.load_cert_pem(pem)


def _join_pem(*pems: bytes) -> bytes:
    return b"".join(p if p.endswith(b"\n") else p + b"\n" for p in pems)
