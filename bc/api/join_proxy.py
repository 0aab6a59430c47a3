"""Join, Renew, Rejoin and SessionCert on a gateway-only process: forwarded to an api process, which alone holds the CA.

The gateway finds the api processes in the store (each registers where it answers, `bc.assembly.server`'s api
loop; or `--api`), tries them in turn while they are UNAVAILABLE, and relays the first answer; any other
refusal is the node's to read, as the api said it. What a forwarding gateway could abuse, and why it
cannot:

* Join: the request's `token_proof` is the token key's signature over the CSR, so the api issues a
  certificate only for the key the token holder chose; a gateway that swaps the CSR gets UNAUTHENTICATED
  and the token stays unused. The answer carries the CA key's signature over the CSR, the certificate and
  the trust bundle (`bc.pki.join_answer`), which `bc join` checks against the pinned CA, so the gateway
  cannot hand the node a bundle of its own (its roots would sign the node's commands).
* Renew: the gateway forwards the node's TLS client certificate (`NODE_CERT_MD`, DER) beside the request.
  The api takes it only from a caller authenticated as a gateway and checks it like its own caller's
  (issued by its CA, stored, unrevoked, unexpired, of the node's current identity), and the node's proof of
  possession over the CSR and timestamp against that certificate's key.

* Rejoin, SessionCert and Renew by proof (`cert_der` set: a TPM-held key): forwarded as they came. The
  request carries the node's certificate and the proof by its key, which the api checks whoever relays it;
  the gateway's own certificate only shows it is a gateway. A session certificate is for the CSR's key, which
  only the node holds: a gateway that swaps the CSR breaks the proof.

A join is not idempotent: an api that consumed the token and then lost the connection leaves the next one
to answer "already used". Only UNAVAILABLE moves on, which grpc gives before a call reaches the handler.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

import grpc
from cryptography.hazmat.primitives import serialization

from bc.api.api_link import ApiLink
from bc.protocol.pb import join_pb2
from bc.store import StoreError
from bc.wire.stubs import join_pb2_grpc
from bc.wire.tls import peer_cert_from_context

log = logging.getLogger("bc.join_proxy")

NODE_CERT_MD = "bc-node-cert-bin"
T = TypeVar("T")


class JoinProxy(join_pb2_grpc.JoinServicer):
    def __init__(self, gateway_id: str, api_addresses: Callable[[], Awaitable[list[str]]], link: ApiLink) -> None:
        self.gateway_id, self.api_addresses, self.link = gateway_id, api_addresses, link

    async def Join(self, request: join_pb2.JoinRequest, context: grpc.aio.ServicerContext) -> join_pb2.JoinResponse:
        response = await self._forward("join", context, lambda address: self.link.join(address, request))
        log.info("event=join-proxy.forwarded token=%s node=%s", request.token_id, response.node_id)
        return response

    async def Renew(self, request: join_pb2.RenewRequest, context: grpc.aio.ServicerContext) -> join_pb2.RenewResponse:
        if request.cert_der:  # by proof: the certificate is in the request, the caller's leaf proves nothing
            response = await self._forward("renew", context, lambda address: self.link.renew(address, request, ()))
            log.info("event=renew-proxy.forwarded by=proof bytes=%d", len(request.cert_der))
            return response
        cert = peer_cert_from_context(context)
        if cert is None:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "renewal needs the node's current certificate")
            raise AssertionError("unreachable: abort raises")
        metadata = ((NODE_CERT_MD, cert.public_bytes(serialization.Encoding.DER)),)
        response = await self._forward("renew", context, lambda address: self.link.renew(address, request, metadata))
        log.info("event=renew-proxy.forwarded serial=%x", cert.serial_number)
        return response

    async def Rejoin(
        self, request: join_pb2.RejoinRequest, context: grpc.aio.ServicerContext
    ) -> join_pb2.RenewResponse:
        response = await self._forward("rejoin", context, lambda address: self.link.rejoin(address, request))
        log.info("event=rejoin-proxy.forwarded bytes=%d", len(request.cert_der))
        return response

    async def SessionCert(
        self, request: join_pb2.SessionCertRequest, context: grpc.aio.ServicerContext
    ) -> join_pb2.SessionCertResponse:
        response = await self._forward(
            "issue a session certificate", context, lambda address: self.link.session_cert(address, request)
        )
        log.info("event=session-cert-proxy.forwarded bytes=%d", len(request.cert_der))
        return response

    async def _forward(self, what: str, context: grpc.aio.ServicerContext, call: Callable[[str], Awaitable[T]]) -> T:
        """The first api process's answer; UNAVAILABLE in one line when none answers."""
        try:
            addresses = await self.api_addresses()
        except StoreError as e:
            await context.abort(
                grpc.StatusCode.UNAVAILABLE,
                f"gateway {self.gateway_id} cannot read the store to find an api process to {what} through: {e}",
            )
            raise AssertionError("unreachable: abort raises") from None
        if not addresses:
            await context.abort(
                grpc.StatusCode.UNAVAILABLE,
                f"gateway {self.gateway_id} finds no api process registered in the store to {what} through;"
                " start one on this store (bc serve --roles api)",
            )
        last = ""
        for address in addresses:
            try:
                return await call(address)
            except grpc.aio.AioRpcError as e:
                if e.code() != grpc.StatusCode.UNAVAILABLE:
                    await context.abort(e.code(), e.details() or "")
                last = f"{address}: {(e.details() or '').splitlines()[0] if e.details() else e.code().name}"
                log.warning("event=%s-proxy.api-unavailable api=%s error=%s", what, address, e.details())
        await context.abort(
            grpc.StatusCode.UNAVAILABLE,
            f"gateway {self.gateway_id} reaches none of the {len(addresses)} api process(es) to {what} through"
            f" (last: {last})",
        )
        raise AssertionError("unreachable: abort raises")
