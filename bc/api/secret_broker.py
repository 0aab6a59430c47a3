"""The secret broker across processes: an api process answers a gateway-only process's forwarded requests.

A gateway-only process holds no CA directory and so no at-rest key (`bc.pki.secret_box`): its sessions'
`SecretRequest`s go, as the nodes sent them, to an api process found in the store (as Join and Renew do,
`bc.api.join_proxy`), over the gateway's own mutual TLS. What a forwarding gateway could abuse, and why
it cannot:

* ask in a node's name: the request is signed by the node's key over its body (which names the node and
  the one-time public key), and the api's broker checks that signature against the node's live
  certificates; a gateway that makes one up, or swaps the key, gets `bad-signature`;
* read the answer: it is a JWE to the node's one-time key.

`SecretBrokerServicer` (api side) takes calls from `gateway:` certificates only; `SecretForwarder`
(gateway side) is the gateway's `SecretPort`: it refuses a request naming another node than the session's
itself, tries the api processes in turn while they are UNAVAILABLE, and answers `unavailable` when none
answers, so the node's section stays PROGRESSING.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import grpc
from cryptography import x509
from google.protobuf.message import DecodeError

from bc.api.api_link import ApiLink
from bc.control.secrets.broker import SecretBroker
from bc.errors import Unauthenticated
from bc.pki.identity import peer_identity
from bc.protocol.pb import secrets_pb2
from bc.store import StoreError
from bc.wire.stubs import secrets_pb2_grpc
from bc.wire.tls import peer_cert_from_context

log = logging.getLogger("bc.secrets")


class SecretBrokerServicer(secrets_pb2_grpc.SecretBrokerServicer):
    def __init__(self, broker: SecretBroker, ca_cert: x509.Certificate) -> None:
        self.broker, self.ca_cert = broker, ca_cert

    async def Answer(
        self, request: secrets_pb2.SecretRequest, context: grpc.aio.ServicerContext
    ) -> secrets_pb2.SecretResponse:
        cert = peer_cert_from_context(context)
        try:
            if cert is None:
                raise Unauthenticated("a forwarded secret request needs the gateway's certificate")
            caller = peer_identity(cert, self.ca_cert)
            if caller.kind != "gateway":
                raise Unauthenticated(f"only a gateway forwards a node's secret request, not a {caller.kind}")
        except Unauthenticated as e:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, e.message)
            raise AssertionError("unreachable: abort raises") from None
        body = secrets_pb2.SecretRequestBody()
        try:
            body.ParseFromString(request.body)
        except DecodeError:
            pass  # the broker refuses it as bad-request
        log.info("event=secret.forwarded gateway=%s node=%s name=%s", caller.name, body.node_id, body.name)
        return await self.broker.answer(body.node_id, request)


class SecretForwarder:
    """A gateway-only process's `SecretPort`: the request, to the first api process that answers."""

    def __init__(self, gateway_id: str, api_addresses: Callable[[], Awaitable[list[str]]], link: ApiLink) -> None:
        self.gateway_id, self.api_addresses, self.link = gateway_id, api_addresses, link

    async def answer(self, node_id: str, request: secrets_pb2.SecretRequest) -> secrets_pb2.SecretResponse:
        body = secrets_pb2.SecretRequestBody()
        try:
            body.ParseFromString(request.body)
        except DecodeError:
            return _no(body, "bad-request", "the request body does not decode")
        if body.node_id != node_id:
            return _no(body, "wrong-node", f"the request names node {body.node_id!r}, the session is {node_id!r}")
        try:
            addresses = await self.api_addresses()
        except StoreError as e:
            return _no(body, "unavailable", f"gateway {self.gateway_id} cannot read the store to find an api: {e}")
        for address in addresses:
            try:
                return await self.link.secret(address, request)
            except grpc.aio.AioRpcError as e:
                log.warning(
                    "event=secret-proxy.api-failed api=%s code=%s error=%s", address, e.code().name, e.details()
                )
        return _no(body, "unavailable", f"gateway {self.gateway_id} reaches no api process holding the broker")


def _no(body: secrets_pb2.SecretRequestBody, reason: str, why: str) -> secrets_pb2.SecretResponse:
    return secrets_pb2.SecretResponse(request_id=body.request_id, refused=reason, message=why)
