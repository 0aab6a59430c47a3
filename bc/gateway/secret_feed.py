"""The gateway's side of the secret broker: where requests go, and the rotation feed.

A request goes to the broker this process holds (`bc.control.secrets.broker`), which needs the at-rest key
beside the CA. A gateway-only process holds no CA directory: `NoBroker` answers `unavailable`, so the
node's section stays PROGRESSING (docs/secrets.md says so: serve secrets from a gateway that also has the
api role and the CA directory).

The rotation feed reads `secret.set` events from the events log (so it sees a `bc secret set` made
through any api process) and tells each session of a node the event names to ask again
(`SecretRotated`): the node re-fetches, for the sections that use the secret, at once rather than at its
next spec. It runs on the revocation feed's tick (every second).
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Mapping
from typing import Protocol

from google.protobuf.message import DecodeError

from bc.protocol.pb import secrets_pb2
from bc.protocol.pb.session_pb2 import GatewayMessage
from bc.seams.link import LinkClosed
from bc.store import Store
from bc.store import events as events_sql

log = logging.getLogger("bc.gateway")


class NoBroker:
    async def answer(self, node_id: str, request: secrets_pb2.SecretRequest) -> secrets_pb2.SecretResponse:
        body = secrets_pb2.SecretRequestBody()
        with contextlib.suppress(DecodeError):
            body.ParseFromString(request.body)
        return secrets_pb2.SecretResponse(
            request_id=body.request_id,
            refused="unavailable",
            message="this gateway holds no secret broker (no CA directory); the node asks again",
        )


class Notifiable(Protocol):
    """An open session a rotation is told to."""

    async def notify_secret(self, msg: GatewayMessage) -> None: ...


class SecretFeed:
    def __init__(self) -> None:
        self.after_seq = -1  # -1: not read yet; the first look starts from the newest event

    async def poll(self, store: Store, sessions: Mapping[str, Notifiable]) -> int:
        """Tell the open sessions of the nodes named by `secret.set` events since the last look; how many."""
        async with store.transaction(write=False) as tx:
            if self.after_seq < 0:
                self.after_seq = await events_sql.last_seq(tx)
                return 0
            rows = await events_sql.of_types_since(tx, self.after_seq, ["secret.set"])
        told = 0
        for r in rows:
            self.after_seq = max(self.after_seq, int(r["seq"]))
            data = json.loads(r["data"])
            msg = GatewayMessage(
                secret_rotated=secrets_pb2.SecretRotated(name=str(data["name"]), version=int(data["version"]))
            )
            for node_id in data.get("nodes", []):
                session = sessions.get(node_id)
                if session is None:
                    continue
                try:
                    await session.notify_secret(msg)
                    told += 1
                except LinkClosed:
                    pass
        if told:
            log.info("event=secret.rotation-told sessions=%d", told)
        return told
