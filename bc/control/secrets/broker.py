"""The secret broker: a node's SecretRequest in, a JWE to its one-time key (or a refusal) out.

The gateway holding the node's session calls `SecretBroker.answer` with the node id its mutual TLS proved
and the request as the node sent it. In order, the request must:

1. decode, and name the session's node (`bad-request`, `wrong-node`);
2. carry the node key's signature over its body, by a live certificate of the node's current identity
   (`bad-signature`): a gateway can neither ask in a node's name nor swap the one-time key;
3. be fresh: issued within `MAX_AGE_MS` of the store's clock (`expired`);
4. be bound to something that names the secret: a spec section (and host unit) at the node's current
   generation, whose stored, signed spec names this secret there (`not-bound`). A binding to an older
   generation is `stale-generation` (the newer spec is on its way: ask again once it is applied);
   A binding that also names an allocation (an instance's user data) must name one of the node's live
   allocations (a reservation placed or active on it: `allocation-not-live`), and an instance of the
   section with that `allocation_id` must name the secret (`not-bound`). Job-step bindings are designed
   for and refused today (`binding-unsupported`);
5. name a secret that exists (`unknown-secret`) and whose scope admits the node (`out-of-scope`).

Then the newest version is opened with the at-rest key and sealed to the request's public key
(`bc.pki.secret_jwe`): what leaves here is ciphertext only the requesting node can open. Every refusal is
published as `secret.refused` (the reason, the binding, never a value), every delivery as
`secret.delivered` (name, version, binding). `RETRY` reasons keep the node's section PROGRESSING;
the others fail it until something changes (a rotation, a new spec, the scope).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

from google.protobuf import json_format
from google.protobuf.message import DecodeError

from bc.control.base.bus import Bus
from bc.control.base.events import publish
from bc.control.secrets import scope as scope_rule
from bc.control.signing.attestation import node_certs
from bc.pki import attest, secret_jwe
from bc.pki.secret_box import SealedElsewhere, SecretBox
from bc.protocol import secret_refs
from bc.protocol.pb import secrets_pb2, spec_pb2
from bc.store import Store, StoreError, Tx
from bc.store import reservations as reservations_sql
from bc.store import secrets as secrets_sql

log = logging.getLogger("bc.secrets")

MAX_AGE_MS = 120_000
"""How far a request's `issued_at_ms` may be from the store's clock, either way."""

UNAVAILABLE = "unavailable"
STALE = "stale-generation"
SEALED_ELSEWHERE = "sealed-elsewhere"
RETRY = frozenset({UNAVAILABLE, STALE, SEALED_ELSEWHERE})
"""Refusals worth asking again: the node keeps its section PROGRESSING, never FAILED for good."""

REFUSALS: dict[str, str] = {
    "bad-request": "the request does not decode or lacks a name or a key",
    "wrong-node": "the request names another node than the session's",
    "bad-signature": "the request is not signed by a live key of the node",
    "expired": "the request's time is too far from the server's",
    "binding-unsupported": "job-step bindings are not built yet",
    "allocation-not-live": "the binding's allocation is not a live allocation of this node",
    STALE: "the binding's generation is not the node's current one",
    "not-bound": "that section of the node's current spec does not name this secret",
    "unknown-secret": "no secret of that name",
    "out-of-scope": "the secret's scope does not admit this node",
    SEALED_ELSEWHERE: "the stored value does not open under this server's key",
    UNAVAILABLE: "the broker cannot answer now",
}
"""Every refusal code the broker answers, with what it means (docs/secrets.md lists them)."""


@dataclass(frozen=True)
class Refused(Exception):
    reason: str
    why: str


class SecretBroker:
    def __init__(self, store: Store, bus: Bus, box: SecretBox) -> None:
        self.store, self.bus, self.box = store, bus, box

    async def answer(self, node_id: str, request: secrets_pb2.SecretRequest) -> secrets_pb2.SecretResponse:
        body = secrets_pb2.SecretRequestBody()
        try:
            body.ParseFromString(request.body)
        except DecodeError:
            return await self._refuse(node_id, body, Refused("bad-request", "the request body does not decode"))
        try:
            now_ms = await self.store.now_ms()
            async with self.store.transaction() as tx:
                try:
                    value, version = await self._check(tx, node_id, body, request, now_ms)
                    token = secret_jwe.seal_answer(
                        body.public_jwk, value, name=body.name, version=version, request_id=body.request_id
                    )
                except Refused as r:
                    await self._published_refusal(tx, node_id, body, r, now_ms)
                    refused = r
                else:
                    await publish(tx, self.bus, "secret.delivered", node_id, _event(body, version=version), now_ms)
                    log.info(
                        "event=secret.delivered node=%s name=%s version=%d binding=%s",
                        node_id,
                        body.name,
                        version,
                        _where(body.binding),
                    )
                    return secrets_pb2.SecretResponse(request_id=body.request_id, jwe=token, version=version)
        except StoreError as e:
            log.warning("event=secret.unavailable node=%s name=%s error=%s", node_id, body.name, e)
            return _refusal(body, Refused(UNAVAILABLE, "the control plane's store failed; ask again"))
        return _refusal(body, refused)

    async def _check(
        self, tx: Tx, node_id: str, body: secrets_pb2.SecretRequestBody, req: secrets_pb2.SecretRequest, now_ms: int
    ) -> tuple[bytes, int]:
        if not body.name or not body.public_jwk or not body.request_id:
            raise Refused("bad-request", "the request lacks a name, a request id or a public key")
        if body.node_id != node_id:
            raise Refused("wrong-node", f"the request names node {body.node_id!r}, the session is {node_id!r}")
        signed = secret_jwe.request_message(req.body)  # the bytes as the node sent them, never re-encoded
        if not attest.verify_by_any(await node_certs(tx, node_id), signed, req.node_sig):
            raise Refused("bad-signature", "no live certificate of the node verifies the request's signature")
        if abs(now_ms - body.issued_at_ms) > MAX_AGE_MS:
            raise Refused("expired", f"issued {now_ms - body.issued_at_ms} ms from the server's time")
        b = body.binding
        if b.job_step:
            raise Refused("binding-unsupported", "job-step bindings are not built yet")
        node = await secrets_sql.node_for_request(tx, node_id)
        if node is None:
            raise Refused("wrong-node", f"node {node_id!r} is not a live node")
        generation = int(node["generation"])
        if b.generation != generation or int(node["spec_sign_pending"] or 0):
            raise Refused(STALE, f"the binding is for generation {b.generation}, the node's spec is at {generation}")
        spec = json_format.Parse(str(node["spec"] or "{}"), spec_pb2.NodeSpec(), ignore_unknown_fields=True)
        if b.allocation_id:
            await _check_allocation(tx, node_id, b, spec, body.name)
        elif body.name not in secret_refs.names(spec, b.section, b.unit):
            raise Refused("not-bound", f"{_where(b)} of generation {generation} does not name secret {body.name!r}")
        row = await secrets_sql.get(tx, body.name)
        if row is None:
            raise Refused("unknown-secret", f"no secret named {body.name!r}")
        scope = scope_rule.Scope(tuple(json.loads(row["scope_nodes"])), tuple(json.loads(row["scope_labels"])))
        if not scope_rule.admits(scope, node_id, json.loads(node["labels"] or "{}")):
            raise Refused("out-of-scope", f"secret {body.name!r}'s scope does not admit node {node_id!r}")
        version = int(row["version"])
        sealed = await secrets_sql.sealed(tx, body.name, version)
        if sealed is None:
            raise Refused(UNAVAILABLE, f"secret {body.name!r} version {version} is not stored")
        try:
            value = self.box.open(body.name, version, bytes(sealed["sealed"]), str(sealed["key_id"]))
        except SealedElsewhere as e:
            raise Refused(SEALED_ELSEWHERE, e.message) from None
        try:
            secret_jwe.parse_public_jwk(body.public_jwk)
        except ValueError as e:
            raise Refused("bad-request", str(e)) from None
        return value, version

    async def _refuse(
        self, node_id: str, body: secrets_pb2.SecretRequestBody, r: Refused
    ) -> secrets_pb2.SecretResponse:
        try:
            now_ms = await self.store.now_ms()
            async with self.store.transaction() as tx:
                await self._published_refusal(tx, node_id, body, r, now_ms)
        except StoreError as e:
            log.warning("event=secret.refusal-not-recorded node=%s error=%s", node_id, e)
        return _refusal(body, r)

    async def _published_refusal(
        self, tx: Tx, node_id: str, body: secrets_pb2.SecretRequestBody, r: Refused, now_ms: int
    ) -> None:
        log.warning(
            "event=secret.refused node=%s name=%s reason=%s binding=%s",
            node_id,
            body.name,
            r.reason,
            _where(body.binding),
        )
        await publish(tx, self.bus, "secret.refused", node_id, _event(body, reason=r.reason, why=r.why), now_ms)


LIVE_ALLOCATION_STATES = ("placed", "active")
"""A reservation's states in which its allocation is on the node (bc.store.reservations)."""


async def _check_allocation(
    tx: Tx, node_id: str, b: secrets_pb2.SecretBinding, spec: spec_pb2.NodeSpec, name: str
) -> None:
    """An allocation binding: the spec's instance of that allocation names the secret, and the allocation
    is live on this node."""
    if name not in secret_refs.allocation_names(spec, b.section, b.allocation_id):
        raise Refused(
            "not-bound", f"no instance of allocation {b.allocation_id!r} in {_where(b)} names secret {name!r}"
        )
    row = await reservations_sql.by_allocation(tx, b.allocation_id)
    if row is None or str(row["node_id"] or "") != node_id or str(row["state"]) not in LIVE_ALLOCATION_STATES:
        raise Refused("allocation-not-live", f"allocation {b.allocation_id!r} is not live on node {node_id!r}")


def _where(b: secrets_pb2.SecretBinding) -> str:
    where = f"{b.section}/{b.unit}@{b.generation}" if b.unit else f"{b.section}@{b.generation}"
    return f"{where} allocation {b.allocation_id}" if b.allocation_id else where


def _event(body: secrets_pb2.SecretRequestBody, **extra: object) -> dict[str, object]:
    b = body.binding
    alloc = {"allocation_id": b.allocation_id} if b.allocation_id else {}
    return {"name": body.name, "section": b.section, "unit": b.unit, "generation": b.generation, **alloc, **extra}


def _refusal(body: secrets_pb2.SecretRequestBody, r: Refused) -> secrets_pb2.SecretResponse:
    return secrets_pb2.SecretResponse(request_id=body.request_id, refused=r.reason, message=r.why)
