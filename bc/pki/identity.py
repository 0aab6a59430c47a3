"""Who is on the other end of a TLS connection, read from the certificate it presented.

The server trusts two roots for client authentication: the cluster CA, and the
install's one join root (`bc.pki.tokens.join_root_cert`), whose key anyone who
knows the CA fingerprint can derive. TLS alone therefore proves only "signed
by one of the trusted roots". These functions add the missing half:
`peer_identity` accepts a node, operator or gateway only if the cluster CA
itself signed the certificate, so a leaf under the join root that calls itself
`node:n1` is refused; `join_leaf_identity` accepts a join client's leaf only
under the join root, and names the token it claims, which the Join handler
then requires the token's proof for (the leaf alone proves nothing).

Validity dates are checked by the TLS handshake; pass `now` (business time)
to check them here as well.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from bc.errors import Unauthenticated, UsageError

PeerKind = Literal["node", "operator", "join", "gateway"]

# Operator and approver names: lowercase ASCII only, so that no two names that look alike
# (`paul` and `p\u0430ul`, `Bob` and `bob`) can be two identities.
SAFE_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,62}")

_TOKEN_ID = re.compile(r"[0-9a-f]{12}")
_IDGEN = re.compile(r"urn:bc:idgen:(0|[1-9][0-9]{0,17})")


@dataclass(frozen=True)
class PeerIdentity:
    kind: PeerKind
    name: str  # node id, operator name or join token id
    serial: str  # lowercase hex
    not_after: float  # epoch seconds
    role: str = ""
    identity_generation: int = 0


def check_safe_name(what: str, name: str) -> None:
    """UsageError unless `name` is in the safe set; the message shows any non-ASCII character escaped."""
    if not SAFE_NAME.fullmatch(name):
        shown = ascii(name[:80]) + ("…" if len(name) > 80 else "")
        raise UsageError(
            f"the {what} {shown} is not valid: use 1 to 63 lowercase ASCII letters, digits, '.', '_' or '-',"
            " starting with a letter or digit"
        )


def make_csr(key: ec.EllipticCurvePrivateKey, node_id: str) -> x509.CertificateSigningRequest:
    """The request a node sends to Join/Renew; the CA keeps only its key and checks its signature."""
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"node:{node_id}")])
    return x509.CertificateSigningRequestBuilder().subject_name(name).sign(key, hashes.SHA256())


def peer_identity(cert: x509.Certificate, ca_cert: x509.Certificate, *, now: float | None = None) -> PeerIdentity:
    """The node or operator `cert` names, if the cluster CA issued it; else `Unauthenticated`."""
    _require_issued_by(cert, ca_cert, "the client certificate was not issued by this cluster's CA")
    _require_client_auth(cert)
    _require_valid_at(cert, now)
    cn = _common_name(cert)
    uris = _san_uris(cert)
    serial, not_after = format(cert.serial_number, "x"), cert.not_valid_after_utc.timestamp()
    if cn.startswith("operator:") and len(cn) > len("operator:"):
        return PeerIdentity("operator", cn.removeprefix("operator:"), serial, not_after)
    if cn.startswith("gateway:") and len(cn) > len("gateway:"):  # a keyless gateway's own certificate
        return PeerIdentity("gateway", cn.removeprefix("gateway:"), serial, not_after)
    if cn.startswith("node:") and len(cn) > len("node:"):
        node_id = cn.removeprefix("node:")
        if f"urn:bc:node:{node_id}" not in uris:
            raise Unauthenticated(f"the node certificate for {node_id!r} does not carry its node URI")
        roles = [u.removeprefix("urn:bc:role:") for u in uris if u.startswith("urn:bc:role:")]
        idgens = [int(m.group(1)) for u in uris if (m := _IDGEN.fullmatch(u))]
        if len(roles) > 1 or len(idgens) != 1:
            raise Unauthenticated(f"the node certificate for {node_id!r} has no single role and identity generation")
        return PeerIdentity("node", node_id, serial, not_after, roles[0] if roles else "", idgens[0])
    raise Unauthenticated(f"the client certificate names neither a node, an operator nor a gateway (CN {cn!r})")


def join_leaf_identity(
    cert: x509.Certificate, join_root: x509.Certificate, *, now: float | None = None
) -> PeerIdentity:
    """The join token a Join caller's leaf claims, if the install's join root signed the leaf.

    A claim only: the join root's key is public, so the caller must still prove the token.
    """
    _require_issued_by(cert, join_root, "the join certificate was not issued by this install's join root")
    _require_client_auth(cert)
    _require_valid_at(cert, now)
    cn = _common_name(cert)
    token_id = cn.removeprefix("join:")
    if not cn.startswith("join:") or not _TOKEN_ID.fullmatch(token_id):
        raise Unauthenticated(f"the join certificate names no join token (CN {cn!r})")
    return PeerIdentity("join", token_id, format(cert.serial_number, "x"), cert.not_valid_after_utc.timestamp())


def rejoin_leaf_identity(cert: x509.Certificate, join_root: x509.Certificate) -> str:
    """The node a Rejoin caller's leaf names (`rejoin:<node id>`), if the join root signed it. A claim only,
    like a join leaf's: the request's proof by the expired certificate's key is what counts."""
    _require_issued_by(cert, join_root, "the re-join certificate was not issued by this install's join root")
    _require_client_auth(cert)
    cn = _common_name(cert)
    node_id = cn.removeprefix("rejoin:")
    if not cn.startswith("rejoin:") or not SAFE_NAME.fullmatch(node_id):
        raise Unauthenticated(f"the re-join certificate names no node (CN {cn!r})")
    return node_id


def _require_issued_by(cert: x509.Certificate, issuer: x509.Certificate, message: str) -> None:
    try:
        cert.verify_directly_issued_by(issuer)
    except (ValueError, TypeError, InvalidSignature):
        raise Unauthenticated(message) from None


def _require_client_auth(cert: x509.Certificate) -> None:
    try:
        eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    except x509.ExtensionNotFound:
        return
    if ExtendedKeyUsageOID.CLIENT_AUTH not in eku:
        raise Unauthenticated("the certificate is not meant for client authentication")


def _require_valid_at(cert: x509.Certificate, now: float | None) -> None:
    if now is None:
        return
    if now > cert.not_valid_after_utc.timestamp():
        raise Unauthenticated("the client certificate has expired; renew it or join again")
    if now < cert.not_valid_before_utc.timestamp():
        raise Unauthenticated("the client certificate is not valid yet; check the clocks")


def _common_name(cert: x509.Certificate) -> str:
    attrs = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if len(attrs) != 1 or not isinstance(attrs[0].value, str):
        raise Unauthenticated("the certificate has no single common name")
    return attrs[0].value


def _san_uris(cert: x509.Certificate) -> list[str]:
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    return san.get_values_for_type(x509.UniformResourceIdentifier)
