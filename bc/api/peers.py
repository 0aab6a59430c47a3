"""Who is calling: the certificate says, never a message.

What a certificate was found to carry is remembered by its PEM bytes (as grpc hands them over) and the CA
that checked it: every new stream and every Admin call presents its certificate again, and parsing and
checking it (x509 load, the CA's signature, the name's attributes) was a quarter of a gateway's samples
while 3,000 nodes reconnected, each refused stream coming back with the same certificate. Only identities
that passed are remembered; expiry is not part of `peer_identity` without a time, and revocation is the
store's to check on every session (`Gateway.refuse_revoked`).
"""

from __future__ import annotations

from collections import OrderedDict

import grpc
from cryptography import x509

from bc.errors import Unauthenticated
from bc.pki.identity import PeerIdentity, peer_identity
from bc.wire.tls import peer_pem_from_context

KNOWN_PEERS = 16_384
"""Certificates remembered (least recently presented first out): a fleet's nodes and operators, at about
200 bytes each beyond the PEM."""


class KnownPeers:
    """PEM bytes and the checking CA's signature → the identity `peer_identity` found, least recent first out."""

    def __init__(self, size: int = KNOWN_PEERS) -> None:
        self.size = size
        self._known: OrderedDict[tuple[bytes, bytes], PeerIdentity] = OrderedDict()
        self.parsed = 0  # certificates checked, not found here (tests)

    def identity(self, pem: bytes, ca_cert: x509.Certificate) -> PeerIdentity:
        key = (pem, ca_cert.signature)
        peer = self._known.get(key)
        if peer is not None:
            self._known.move_to_end(key)
            return peer
        from bc.pki import keys

        self.parsed += 1
        peer = peer_identity(keys.load_cert_pem(pem), ca_cert)  # raises for what the CA did not issue: not kept
        self._known[key] = peer
        if len(self._known) > self.size:
            self._known.popitem(last=False)
        return peer


PEERS = KnownPeers()


def peer_of(
    context: grpc.aio.ServicerContext, ca_cert: x509.Certificate, kind: str, known: KnownPeers = PEERS
) -> PeerIdentity:
    pem = peer_pem_from_context(context)
    if pem is None:
        raise Unauthenticated("this call needs a client certificate")
    peer = known.identity(pem, ca_cert)
    if peer.kind != kind:
        raise Unauthenticated(f"this call needs a {kind} certificate, not a {peer.kind} one")
    return peer


def operator_of(context: grpc.aio.ServicerContext, ca_cert: x509.Certificate) -> PeerIdentity:
    """The operator certificate's identity; whether that operator may make the call is `bc.control.trust.operators`'."""
    return peer_of(context, ca_cert, "operator")
