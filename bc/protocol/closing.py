"""Why a session ended, as a typed code both ends share (`CloseReason` in session.proto).

The gateway says why it ends a session with a `CloseReason`; the node decides
what to do by comparing codes, never by reading the status message (whose
wording is for people and may change). Over gRPC the code rides in the
trailing metadata of the closing status under `METADATA_KEY`, as the enum
value's name; `bc.wire.link` writes and reads it, and the in-memory links of
`bc.seams.network` carry it as is. A name this build does not know reads as
`CLOSE_REASON_UNSPECIFIED`, which a node treats as any other ended stream.

`SessionRefused` is how the control plane's code raises a refusal that carries
its reason up to the place that closes the stream.
"""

from __future__ import annotations

from bc.errors import Unauthenticated
from bc.protocol.pb import session_pb2
from bc.protocol.pb.session_pb2 import CloseReason

METADATA_KEY = "bc-close-reason"
RETRY_AFTER_KEY = "bc-retry-after-ms"
"""A RESOURCE_EXHAUSTED refusal's trailing metadata: when to dial again, in milliseconds (`bc.gateway.admission`)."""

UNSPECIFIED = session_pb2.CLOSE_REASON_UNSPECIFIED
REVOKED = session_pb2.CLOSE_CERTIFICATE_REVOKED
IDENTITY_REPLACED = session_pb2.CLOSE_IDENTITY_REPLACED
EXPIRED = session_pb2.CLOSE_CERTIFICATE_EXPIRED
SUPERSEDED = session_pb2.CLOSE_SUPERSEDED
GATEWAY_UNAVAILABLE = session_pb2.CLOSE_GATEWAY_UNAVAILABLE

CERTIFICATE_IS_DONE: frozenset[CloseReason] = frozenset({REVOKED, IDENTITY_REPLACED})
"""After these the node never dials with this certificate again (it says so in identity.json)."""

_BY_NAME: dict[str, CloseReason] = {
    CloseReason.Name(r): r for r in (UNSPECIFIED, REVOKED, IDENTITY_REPLACED, EXPIRED, SUPERSEDED, GATEWAY_UNAVAILABLE)
}


def name_of(reason: CloseReason) -> str:
    return CloseReason.Name(reason)


def from_name(name: str) -> CloseReason:
    """The code a metadata value names; unknown (a newer gateway) or absent: UNSPECIFIED."""
    return _BY_NAME.get(name, UNSPECIFIED)


class SessionRefused(Unauthenticated):
    """A node's certificate refused for a reason the node must act on (revoked, an older identity)."""

    def __init__(self, reason: CloseReason, message: str) -> None:
        super().__init__(message)
        self.reason = reason
