"""Join.Join and Join.Renew.

Join: the caller's TLS leaf was issued by a join token's key; the token becomes a certificate.
Renew: the caller's TLS leaf is its current node certificate; a proof by that key gets a new one. Through a
gateway-only process (`bc.api.renew_proxy`) the caller is the gateway, and the node's certificate comes
forwarded beside the request: taken only from a caller whose own certificate says `gateway:`, then checked
exactly as a direct caller's would be.

Both replies carry the trust bundle as `Intent` holds it now (with the quorum
settings the gateways last read), and its signed envelope when signing is on.
"""

from __future__ import annotations

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import NameOID

from bc.api.renew_proxy import NODE_CERT_MD
from bc.control import identity
from bc.control.bus import Bus
from bc.control.identity import NODE_CERT_TTL_S
from bc.control.intent import Intent
from bc.control.signer import Signer
from bc.errors import BcError, Unauthenticated, UsageError
from bc.pki.ca import CertificateAuthority
from bc.pki.identity import join_leaf_identity, peer_identity
from bc.protocol.pb import join_pb2
from bc.store import Store
from bc.store import identity as id_sql
from bc.wire.status import abort_with
from bc.wire.stubs import join_pb2_grpc
from bc.wire.tls import peer_cert_from_context


class JoinServicer(join_pb2_grpc.JoinServicer):
    def __init__(
        self,
        store: Store,
        bus: Bus,
        ca: CertificateAuthority,
        signer: Signer,
        intent: Intent,
        *,
        node_cert_ttl_s: int = NODE_CERT_TTL_S,
    ) -> None:
        self.store, self.bus, self.ca, self.signer, self.intent = store, bus, ca, signer, intent
        self.node_cert_ttl_s = node_cert_ttl_s

    async def _token_id(self, context: grpc.aio.ServicerContext) -> str:
        cert = peer_cert_from_context(context)
        if cert is None:
            raise Unauthenticated("joining needs the client certificate derived from a join token")
        cns = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
        cn = str(cns[0].value) if cns else ""
        if not cn.startswith("join:"):
            raise Unauthenticated("joining needs the client certificate derived from a join token")
        token_id = cn.removeprefix("join:")
        async with self.store.transaction(write=False) as tx:
            tok = await id_sql.get_token(tx, token_id)
        if tok is None:
            raise Unauthenticated("the join token is unknown to this server")
        root = x509.load_pem_x509_certificate(str(tok["root_cert_pem"]).encode())
        join_leaf_identity(cert, root)
        return token_id

    def _renewing_cert(self, context: grpc.aio.ServicerContext) -> x509.Certificate:
        """The node certificate a renewal is for: the caller's own, or one a gateway forwarded."""
        cert = peer_cert_from_context(context)
        if cert is None:
            raise Unauthenticated("renewal needs the node's current certificate")
        forwarded = [v for k, v in (context.invocation_metadata() or ()) if k == NODE_CERT_MD]
        if not forwarded:
            return cert
        caller = peer_identity(cert, self.ca.certificate)
        if caller.kind != "gateway":
            raise Unauthenticated(f"only a gateway forwards a node's certificate, not a {caller.kind}")
        value = forwarded[0]
        try:
            return x509.load_der_x509_certificate(value if isinstance(value, bytes) else value.encode())
        except ValueError:
            raise Unauthenticated("the forwarded node certificate does not parse") from None

    async def Join(self, request: join_pb2.JoinRequest, context: grpc.aio.ServicerContext) -> join_pb2.JoinResponse:
        try:
            token_id = await self._token_id(context)
            if not request.csr_der:
                raise UsageError("the join request carries no CSR")
            joined = await identity.join(
                self.store,
                self.bus,
                self.signer,
                self.ca,
                token_id,
                request.csr_der,
                request.hostname,
                ttl_s=self.node_cert_ttl_s,
            )
        except BcError as e:
            await abort_with(context, e)
            raise  # unreachable: abort raises
        resp = join_pb2.JoinResponse(
            node_id=joined.node_id,
            role=joined.role,
            cert_pem=joined.cert_pem,
            ca_pem=self.ca.certificate.public_bytes(serialization.Encoding.PEM),
            trust=self.intent.trust_bundle(),
            identity_generation=joined.identity_generation,
        )
        signed = self.intent.trust_envelope()
        if signed is not None:
            resp.trust_envelope.CopyFrom(signed)
        return resp

    async def Renew(self, request: join_pb2.RenewRequest, context: grpc.aio.ServicerContext) -> join_pb2.RenewResponse:
        try:
            cert = self._renewing_cert(context)
            if not request.csr_der or not request.proof:
                raise UsageError("the renewal request needs a CSR and a proof of possession")
            renewed = await identity.renew(
                self.store,
                self.bus,
                self.ca,
                cert,
                request.csr_der,
                request.timestamp_ms,
                request.proof,
                ttl_s=self.node_cert_ttl_s,
            )
        except BcError as e:
            await abort_with(context, e)
        resp = join_pb2.RenewResponse(cert_pem=renewed.cert_pem, trust=self.intent.trust_bundle())
        signed = self.intent.trust_envelope()
        if signed is not None:  # the same signed bundle Join and Welcome carry
            resp.trust_envelope.CopyFrom(signed)
        return resp
