"""Join.Join, Join.Renew, Join.Rejoin and Join.SessionCert.

Join: the caller's TLS leaf is under the install's join root (`bc.pki.tokens.join_root_cert`, which proves
nothing: its key is derived from the CA fingerprint) and names a token, or the caller is a gateway-only
process forwarding the node's request (`bc.api.join_proxy`); the request proves that token (`token_proof`
over the CSR, checked by `bc.control.trust.identity.join`), and the token becomes a certificate for that CSR's
key. The answer carries the CA key's signature over the CSR, the certificate and the trust bundle
(`bc.pki.join_answer`), so a forwarding gateway can change none of them.
Renew: the caller's TLS leaf is its current node certificate; a proof by that key gets a new one. Through a
gateway-only process (`bc.api.join_proxy`) the caller is the gateway, and the node's certificate comes
forwarded beside the request: taken only from a caller whose own certificate says `gateway:`, then checked
exactly as a direct caller's would be.

Rejoin: a node whose certificate expired cannot make a TLS handshake with it; it calls with a leaf under the
join root naming `rejoin:<node id>` (or through a gateway that forwards the call, whose `gateway:` certificate
is the caller), with the expired certificate and a proof by its key in the request, which
`bc.control.trust.rejoin` judges (`bc.pki.rejoin` holds the rule).

Renew by proof (a node whose key the TPM holds, which TLS cannot use) and SessionCert (the in-memory key
such a node's session uses, `bc.control.trust.session_cert`) are called as Rejoin is: a leaf under the join root
naming the node, or a forwarding gateway; the request carries the node's certificate and a proof by its key.

A TPM join (`tpm` set) to a server with EK CA roots (`bc.pki.tpm_ek`, the file beside the CA) takes two calls:
the first, once the token and the AK's certification check out, is answered with a credential-activation
challenge only (nothing consumed, nothing stored); the second carries the secret the TPM recovered, and only then
is the token used and the certificate issued. Without roots a TPM join is one call, the AK on the token's word.

Join, Renew and Rejoin reply with the trust bundle as `Intent` holds it now (with the quorum
settings the gateways last read), and its signed envelope when signing is on.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from bc.api.join_proxy import NODE_CERT_MD
from bc.control.base.bus import Bus
from bc.control.signing.signer import Signer
from bc.control.trust import identity, rejoin, session_cert, ssh
from bc.control.trust.identity import NODE_CERT_TTL_S
from bc.control.trust.intent import Intent
from bc.errors import BcError, Unauthenticated, UsageError
from bc.pki import tokens, tpm_credential, tpm_ek
from bc.pki.ca import CertificateAuthority
from bc.pki.identity import join_leaf_identity, peer_identity, rejoin_leaf_identity
from bc.pki.secrets_source import Secrets, SystemSecrets
from bc.pki.tpm_attest import TpmCertification
from bc.protocol.pb import join_pb2
from bc.store import Store
from bc.wire.status import abort_with
from bc.wire.stubs import join_pb2_grpc
from bc.wire.tls import peer_cert_from_context

log = logging.getLogger("bc.join")


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
        secrets: Secrets | None = None,
        ek_roots: Sequence[x509.Certificate] = (),
    ) -> None:
        """`ek_roots`: the EK CAs a TPM join's endorsement key certificate must chain to (none: the AK is taken on
        the token's word); `secrets`: the activation secrets and seeds (the OS's by default)."""
        self.store, self.bus, self.ca, self.signer, self.intent = store, bus, ca, signer, intent
        self.node_cert_ttl_s = node_cert_ttl_s
        self.secrets = secrets or SystemSecrets()
        self.ek_roots = tuple(ek_roots)
        self.join_root = tokens.join_root_cert(ca.fingerprint)

    def _token_id(self, request: join_pb2.JoinRequest, context: grpc.aio.ServicerContext) -> str:
        """The token the request claims; `identity.join` checks its proof.

        A caller with a join leaf names its token there too. A gateway forwarding a node's join
        (`bc.api.join_proxy`) is the caller itself: its `gateway:` certificate carries the request, and
        the token is the request's, which only the proof over the CSR makes good.
        """
        cert = peer_cert_from_context(context)
        if cert is None:
            raise Unauthenticated("joining needs the join client certificate `bc join` makes")
        if not request.token_id or not request.token_proof:
            raise UsageError(
                "the join request carries no token id and proof; join with a `bc join` as recent as this server"
            )
        if cert.issuer != self.join_root.subject:
            caller = peer_identity(cert, self.ca.certificate)  # raises for a certificate the CA did not sign
            if caller.kind != "gateway":
                raise Unauthenticated(f"only a gateway forwards a node's join, not a {caller.kind}")
            log.info("event=join.forwarded gateway=%s token=%s", caller.name, request.token_id)
            return request.token_id
        claimed = join_leaf_identity(cert, self.join_root).name
        if request.token_id != claimed:
            raise Unauthenticated("the join request names another token than its client certificate")
        return claimed

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
        tpm = _tpm(request.tpm) if request.HasField("tpm") else None
        try:
            token_id = self._token_id(request, context)
            if not request.csr_der:
                raise UsageError("the join request carries no CSR")
            if tpm is not None and self.ek_roots:
                if not request.HasField("activation"):
                    return await self._challenge(token_id, request, tpm)
                await self._check_activation(token_id, request, tpm)
            joined = await identity.join(
                self.store,
                self.bus,
                self.signer,
                self.ca,
                token_id,
                request.csr_der,
                request.hostname,
                proof=request.token_proof,
                ttl_s=self.node_cert_ttl_s,
                tpm=tpm,
                endorsed=tpm is not None and bool(self.ek_roots),
            )
        except BcError as e:
            if tpm is not None and self.ek_roots:
                log.warning("event=join.tpm-refused token=%r error=%r", request.token_id, e.message)
            await abort_with(context, e)
            raise  # unreachable: abort raises
        trust = self.intent.trust_bundle()
        # The node's baseline: the SSH CA its access section will carry, which it then takes without a quorum.
        ca = await ssh.get_ca(self.store)
        ssh_ca_keys = [str(ca["public_key"])] if ca is not None else []
        resp = join_pb2.JoinResponse(
            node_id=joined.node_id,
            role=joined.role,
            cert_pem=joined.cert_pem,
            ca_pem=self.ca.certificate.public_bytes(serialization.Encoding.PEM),
            trust=trust,
            identity_generation=joined.identity_generation,
            answer_signature=self.ca.sign_join_answer(
                request.csr_der, joined.cert_pem, trust.SerializeToString(deterministic=True), ssh_ca_keys
            ),
            ssh_ca_keys=ssh_ca_keys,
        )
        signed = self.intent.trust_envelope()
        if signed is not None:
            resp.trust_envelope.CopyFrom(signed)
        return resp

    async def _challenge(
        self, token_id: str, request: join_pb2.JoinRequest, tpm: TpmCertification
    ) -> join_pb2.JoinResponse:
        """The first call of a TPM join to a server with EK roots: checks, then the credential to activate."""
        await identity.check_join(self.store, token_id, request.csr_der, request.token_proof, tpm)
        challenge = tpm_ek.make_challenge(
            self.ca.sign_activation_ticket,
            self.ek_roots,
            await self.store.now_ms(),
            token_id=token_id,
            csr_der=request.csr_der,
            ek_der=request.ek_cert_der,
            ak_public=request.ak_public,
            ak_spki_der=tpm.ak_spki_der,
            secret=self.secrets.token_bytes(tpm_ek.SECRET_BYTES),
            seed=self.secrets.token_bytes(tpm_credential.SEED_BYTES),
        )
        log.info("event=join.tpm-challenge token=%s", token_id)
        return join_pb2.JoinResponse(
            challenge=join_pb2.TpmChallenge(
                credential=challenge.credential, secret=challenge.secret, ticket=challenge.ticket
            )
        )

    async def _check_activation(self, token_id: str, request: join_pb2.JoinRequest, tpm: TpmCertification) -> None:
        """The second call: the ticket is ours for this very request, and the secret the one it sealed."""
        tpm_ek.ak_name(request.ak_public, tpm.ak_spki_der)  # the AK the certificate will name is the one activated
        tpm_ek.check_activation(
            self.ca.certificate.public_key(),  # type: ignore[arg-type]
            request.activation.ticket,
            request.activation.secret,
            token_id=token_id,
            csr_der=request.csr_der,
            ek_der=request.ek_cert_der,
            ak_public=request.ak_public,
            now_ms=await self.store.now_ms(),
        )

    async def Renew(self, request: join_pb2.RenewRequest, context: grpc.aio.ServicerContext) -> join_pb2.RenewResponse:
        if request.cert_der:
            return await self._renew_by_proof(request, context)
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
                tpm=_tpm(request.tpm) if request.HasField("tpm") else None,
            )
        except BcError as e:
            await abort_with(context, e)
        return self._renew_response(renewed.cert_pem)

    async def Rejoin(
        self, request: join_pb2.RejoinRequest, context: grpc.aio.ServicerContext
    ) -> join_pb2.RenewResponse:
        try:
            self._rejoin_caller(request, context)
            if not request.cert_der or not request.csr_der or not request.proof:
                raise UsageError("the re-join request needs the expired certificate, a CSR and a proof of possession")
            renewed = await rejoin.rejoin(
                self.store,
                self.bus,
                self.ca,
                request.cert_der,
                request.csr_der,
                request.timestamp_ms,
                request.nonce,
                request.proof,
                ttl_s=self.node_cert_ttl_s,
                tpm=_tpm(request.tpm) if request.HasField("tpm") else None,
            )
        except BcError as e:
            await abort_with(context, e)
        return self._renew_response(renewed.cert_pem)

    async def _renew_by_proof(
        self, request: join_pb2.RenewRequest, context: grpc.aio.ServicerContext
    ) -> join_pb2.RenewResponse:
        """A renewal with the certificate in the request (a TPM-held key: `bc.pki.renewal`, "by proof")."""
        try:
            self._proof_caller(request.cert_der, context, "renewal")
            if not request.csr_der or not request.proof:
                raise UsageError("the renewal request needs a CSR and a proof of possession")
            renewed = await identity.renew_by_proof(
                self.store,
                self.bus,
                self.ca,
                request.cert_der,
                request.csr_der,
                request.timestamp_ms,
                request.nonce,
                request.proof,
                ttl_s=self.node_cert_ttl_s,
                tpm=_tpm(request.tpm) if request.HasField("tpm") else None,
            )
        except BcError as e:
            await abort_with(context, e)
        return self._renew_response(renewed.cert_pem)

    async def SessionCert(
        self, request: join_pb2.SessionCertRequest, context: grpc.aio.ServicerContext
    ) -> join_pb2.SessionCertResponse:
        try:
            self._proof_caller(request.cert_der, context, "session certificate request")
            if not request.cert_der or not request.csr_der or not request.proof:
                raise UsageError(
                    "the session certificate request needs the node's certificate, a CSR and a proof of possession"
                )
            issued = await session_cert.issue_session_cert(
                self.store,
                self.bus,
                self.ca,
                request.cert_der,
                request.csr_der,
                request.timestamp_ms,
                request.nonce,
                request.proof,
            )
        except BcError as e:
            await abort_with(context, e)
        return join_pb2.SessionCertResponse(cert_pem=issued.cert_pem)

    def _rejoin_caller(self, request: join_pb2.RejoinRequest, context: grpc.aio.ServicerContext) -> None:
        self._proof_caller(request.cert_der, context, "re-join")

    def _proof_caller(self, cert_der: bytes, context: grpc.aio.ServicerContext, what: str) -> None:
        """A call the request's proof authenticates (a re-join, a renewal by proof, a session certificate) comes
        from a leaf under the join root naming the node (`rejoin:<node id>`, which proves nothing), or from a
        forwarding gateway."""
        cert = peer_cert_from_context(context)
        if cert is None:
            raise Unauthenticated(f"a {what} needs the client certificate under the join root the node makes")
        if cert.issuer != self.join_root.subject:
            caller = peer_identity(cert, self.ca.certificate)
            if caller.kind != "gateway":
                raise Unauthenticated(f"only a gateway forwards a node's {what}, not a {caller.kind}")
            return
        claimed = rejoin_leaf_identity(cert, self.join_root)
        try:
            named = x509.load_der_x509_certificate(cert_der)
            node = peer_identity(named, self.ca.certificate).name
        except (ValueError, BcError):
            return  # the request's handler refuses it in its own words
        if node != claimed:
            raise Unauthenticated(f"the {what} names another node than its client certificate")

    def _renew_response(self, cert_pem: bytes) -> join_pb2.RenewResponse:
        resp = join_pb2.RenewResponse(cert_pem=cert_pem, trust=self.intent.trust_bundle())
        signed = self.intent.trust_envelope()
        if signed is not None:  # the same signed bundle Join and Welcome carry
            resp.trust_envelope.CopyFrom(signed)
        return resp


def _tpm(m: join_pb2.TpmCertification) -> TpmCertification:
    return TpmCertification(m.ak_spki_der, m.key_public, m.attest, m.signature)
