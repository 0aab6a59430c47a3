"""Who is calling: the certificate says, never a message."""

from __future__ import annotations

import grpc
from cryptography import x509

from bc.errors import Unauthenticated
from bc.pki.identity import PeerIdentity, peer_identity
from bc.wire.tls import peer_cert_from_context


def peer_of(context: grpc.aio.ServicerContext, ca_cert: x509.Certificate, kind: str) -> PeerIdentity:
    cert = peer_cert_from_context(context)
    if cert is None:
        raise Unauthenticated("this call needs a client certificate")
    peer = peer_identity(cert, ca_cert)
    if peer.kind != kind:
        raise Unauthenticated(f"this call needs a {kind} certificate, not a {peer.kind} one")
    return peer


def operator_of(context: grpc.aio.ServicerContext, ca_cert: x509.Certificate) -> PeerIdentity:
    """The operator certificate's identity; whether that operator may make the call is `bc.control.operators`'."""
    return peer_of(context, ca_cert, "operator")
