"""A client certificate is checked once and its identity remembered (bc.api.peers.KnownPeers)."""

from __future__ import annotations

import random
from typing import Any, cast

import grpc
import pytest

from bc.api.peers import KnownPeers, peer_of
from bc.errors import Unauthenticated
from bc.pki import keys
from bc.pki.ca import CertificateAuthority
from bc.pki.identity import make_csr
from bc.pki.secrets_source import SystemSecrets
from bc.seams.clock import Clock


class Ctx:
    def __init__(self, pem: bytes) -> None:
        self.pem = pem

    def auth_context(self) -> dict[str, list[bytes]]:
        return {"x509_pem_cert": [self.pem]}


def ctx(pem: bytes) -> grpc.aio.ServicerContext[Any, Any]:
    """A call's context as `peer_of` reads it: only the peer's certificate (the fake stands for grpc's)."""
    return cast("grpc.aio.ServicerContext[Any, Any]", Ctx(pem))


def _pem(ca: CertificateAuthority, node: str) -> bytes:
    return keys.cert_to_pem(ca.issue_node_cert(make_csr(keys.generate_key(), node), node, "gpu", 1))


def test_the_same_certificate_is_checked_once_and_the_least_recent_leaves_first(ca: CertificateAuthority) -> None:
    known = KnownPeers(size=2)
    a, b, c = _pem(ca, "n1"), _pem(ca, "n2"), _pem(ca, "n3")
    assert peer_of(ctx(a), ca.certificate, "node", known).name == "n1"
    assert peer_of(ctx(a), ca.certificate, "node", known).name == "n1"
    assert known.parsed == 1
    known.identity(b, ca.certificate)
    known.identity(a, ca.certificate)  # a is the most recent again
    known.identity(c, ca.certificate)  # b leaves
    known.identity(a, ca.certificate)
    assert known.parsed == 3
    known.identity(b, ca.certificate)
    assert known.parsed == 4


def test_a_refused_certificate_is_not_remembered_and_the_kind_is_still_checked(
    ca: CertificateAuthority, clock: Clock
) -> None:
    known = KnownPeers()
    other = CertificateAuthority.create(clock, random.Random(2), SystemSecrets())
    stranger = _pem(other, "n1")
    for _ in range(2):
        with pytest.raises(Unauthenticated):
            known.identity(stranger, ca.certificate)
    assert known.parsed == 2
    with pytest.raises(Unauthenticated, match="needs a operator certificate"):
        peer_of(ctx(_pem(ca, "n1")), ca.certificate, "operator", known)
