"""The seam under both session cores: send and receive protocol messages, close.

A session is a `Link`, whatever carries it: the gRPC adapters (`bc.wire.link`, the production transport)
and the in-memory network's links (`bc.seams.network`, the simulator, the harness and the tests). The
cores cannot tell them apart. It sits here, under the transports, so that neither of them (nor the agent
and the gateway that drive it) imports the other to name it.

A close carries a typed reason (`bc.protocol.closing`) besides the gRPC code
and details: the server end puts it in the trailing metadata of the status it
aborts with, and the client end reads it back into `LinkClosed.reason`, so the
agent decides "revoked", "expired" or "superseded" by code equality. A gateway shedding load says when
to come back the same way (`retry_after_ms`, metadata `bc-retry-after-ms`; `LinkClosed.retry_after_ms`).
"""

from __future__ import annotations

from typing import Protocol, TypeVar

from bc.protocol import closing
from bc.protocol.pb.session_pb2 import CloseReason

In = TypeVar("In", covariant=True)
Out = TypeVar("Out", contravariant=True)


class LinkClosed(Exception):
    """The peer or the transport ended the link: `code` and `details` say how (for people), `reason` why (for code)."""

    def __init__(
        self, code: str, details: str, reason: CloseReason = closing.UNSPECIFIED, retry_after_ms: int | None = None
    ) -> None:
        super().__init__(f"{code}: {details}")
        self.code = code
        self.details = details
        self.reason = reason
        self.retry_after_ms = retry_after_ms
        """An overloaded gateway's word on when to dial again (None: it named no time)."""


class Link(Protocol[In, Out]):
    async def send(self, msg: Out) -> None: ...

    async def recv(self) -> In | None:
        """The next message, or None at a clean end of stream."""

    async def close(
        self, code: str, details: str, reason: CloseReason = closing.UNSPECIFIED, *, retry_after_ms: int | None = None
    ) -> None:
        """End the link; the peer's `recv` raises `LinkClosed(code, details, reason, retry_after_ms)`."""
