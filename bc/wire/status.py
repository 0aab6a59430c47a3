"""Our error tree on the wire: one gRPC status code per `BcError` class, and back.

    BcError          <-> UNKNOWN              (what grpc itself reports for an unhandled exception)
    UsageError       <-> INVALID_ARGUMENT     (OUT_OF_RANGE reads as a UsageError too)
    NotFound         <-> NOT_FOUND
    Conflict         <-> FAILED_PRECONDITION  (ALREADY_EXISTS and ABORTED read as Conflict too)
    Unavailable      <-> UNAVAILABLE          (DEADLINE_EXCEEDED, CANCELLED and other RESOURCE_EXHAUSTED too)
    Unauthenticated  <-> UNAUTHENTICATED      (PERMISSION_DENIED too)
    ProtocolError    <-> INTERNAL             (UNIMPLEMENTED too: the peers disagree on the contract)

Every class round-trips exactly, so the CLI's exit code is the one the server
meant. The base class goes out as UNKNOWN rather than INTERNAL: INTERNAL is
what grpc reports when a message does not parse, which is a broken contract
(exit 7), while an unexpected server-side failure is exit 1.

RESOURCE_EXHAUSTED is two things. gRPC itself says it when a message is over
a receive or send limit ("Received message larger than max (X vs. Y)"): that
is bad input, a UsageError (exit 2) naming the limit of `bc.protocol.limits`
and never "unreachable". Any other RESOURCE_EXHAUSTED is a server shedding load
(a retry may help): Unavailable.

Servicers raise `BcError`s and turn them into a status with `abort_with`;
clients turn an `AioRpcError` back with `status_to_error`, giving the server's
address so that the error says where.

A connection that failed or broke (refused, reset, closed) is a server that is down
or restarting: `bc serve at ADDR is not answering (connection refused)`, exit 5. Only
our side refusing the server's certificate (a TLS handshake failure) is exit 6 here;
a server refusing the operator's certificate looks like a closed connection to grpc,
and the Admin client tells it apart itself (`bc.client.tls_probe`). A name that does not
resolve keeps "cannot reach".
"""

from __future__ import annotations

import re
from typing import Any, NoReturn

import grpc

from bc.errors import (
    BcError,
    Conflict,
    NotFound,
    Overloaded,
    ProtocolError,
    Unauthenticated,
    Unavailable,
    UsageError,
)
from bc.protocol.limits import LIMITS, truncate_text
from bc.protocol.text_safety import one_line

_OUTBOUND: tuple[tuple[type[BcError], grpc.StatusCode], ...] = (
    (UsageError, grpc.StatusCode.INVALID_ARGUMENT),
    (NotFound, grpc.StatusCode.NOT_FOUND),
    (Conflict, grpc.StatusCode.FAILED_PRECONDITION),
    (Overloaded, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (Unavailable, grpc.StatusCode.UNAVAILABLE),
    (Unauthenticated, grpc.StatusCode.UNAUTHENTICATED),
    (ProtocolError, grpc.StatusCode.INTERNAL),
)

_INBOUND: dict[grpc.StatusCode, type[BcError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: UsageError,
    grpc.StatusCode.OUT_OF_RANGE: UsageError,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.FAILED_PRECONDITION: Conflict,
    grpc.StatusCode.ALREADY_EXISTS: Conflict,
    grpc.StatusCode.ABORTED: Conflict,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.RESOURCE_EXHAUSTED: Unavailable,  # load shedding; a message over a limit is a UsageError
    grpc.StatusCode.CANCELLED: Unavailable,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.PERMISSION_DENIED: Unauthenticated,
    grpc.StatusCode.INTERNAL: ProtocolError,
}

# Substrings of grpc's own UNAVAILABLE details that mean "no connection was made",
# as opposed to a server that answered UNAVAILABLE on purpose (e.g. its store is down).
_CONNECT_HINTS = (
    "failed to connect",
    "errors resolving",
    "connection refused",
    "connect failed",
    "dns resolution failed",
    "name resolution",
    "socket closed",
    "connection reset",
    "no route to host",
    "network is unreachable",
    "timeout occurred",
    "handshake",
)


# A name that does not resolve is not a server that is down: it keeps "cannot reach".
_NAME_HINTS = ("errors resolving", "dns resolution", "name resolution", "domain name not found")

# grpc's words for a connection that failed or broke, and the two or three words an operator is told.
_CONNECTION_REASONS = (
    ("connection refused", "connection refused"),
    ("connection reset", "connection reset"),
    ("socket closed", "connection closed"),
    ("stream removed", "connection closed"),
    ("broken pipe", "connection closed"),
    # grpc's words when the peer (or a deadline) shut the socket in the middle of the TLS handshake: no TLS reason.
    ("endpoint closing", "connection closed"),
    ("no route to host", "no route to host"),
    ("network is unreachable", "network is unreachable"),
    ("timeout occurred", "no answer in time"),
)


# gRPC's own words for a message over a limit, e.g. "CLIENT: Received message larger than max (40004 vs. 30000)";
# the side is missing in some versions, so it is optional.
_TOO_LARGE = re.compile(r"(?:(CLIENT|SERVER): )?(Received|Sent) message larger than max \((\d+) vs\. (\d+)\)")

# BoringSSL's reason in a handshake failure, e.g. `OPENSSL_internal:CERTIFICATE_VERIFY_FAILED`.
_SSL_REASON = re.compile(r"OPENSSL_internal:([A-Z0-9_]+)")


def error_to_status(err: BcError) -> tuple[grpc.StatusCode, str]:
    """The status code and details a servicer sends for `err`."""
    # A message may quote what the caller sent (a kind, a node id); it leaves as one visible line, cut to
    # max_status_bytes: the details travel in gRPC's trailing metadata, and a 20 KiB id quoted whole made the
    # client drop the whole reply ("metadata size exceeds hard limit") and say the server was unreachable.
    message = truncate_text(one_line(err.message), LIMITS.max_status_bytes)
    for cls, code in _OUTBOUND:
        if isinstance(err, cls):
            return code, message
    return grpc.StatusCode.UNKNOWN, message


def status_to_error(code: grpc.StatusCode, details: str, *, server: str | None = None) -> BcError:
    """The `BcError` a client raises for a failed call; `server` names the peer in connection errors."""
    details = (details or "").strip()
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        where = f"bc serve at {server}" if server else "the server"
        return Unavailable(f"{where} did not answer in time")
    if code == grpc.StatusCode.UNAVAILABLE and _is_connect_failure(details):
        return _connect_error(details, server)
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        too_large = _too_large_error(details, server)
        if too_large is not None:
            return too_large
    if code == grpc.StatusCode.UNIMPLEMENTED:
        # The server predates (or postdates) this client: say so rather than grpc's "Method not found!".
        where = f"bc serve at {server}" if server else "the server"
        return ProtocolError(f"{where} does not implement this call; do the client and server versions differ?")
    cls = _INBOUND.get(code, BcError)
    return cls(details or f"the server failed with {code.name}")


async def abort_with(context: Any, err: BcError) -> NoReturn:
    """End an RPC with `err`'s status; `context` is a `grpc.aio.ServicerContext`."""
    code, message = error_to_status(err)
    await context.abort(code, message)
    # context.abort always raises; this line only keeps the NoReturn promise honest.
    raise AssertionError("grpc.aio ServicerContext.abort returned")


def _too_large_error(details: str, server: str | None) -> UsageError | None:
    """gRPC refused a message over its size limit: which message, how big, and the limit by name."""
    m = _TOO_LARGE.search(details)
    if m is None:
        return None
    side, direction, size, limit = m.group(1), m.group(2), int(m.group(3)), int(m.group(4))
    where = f"bc serve at {server}" if server else "bc serve"
    if side == "CLIENT" and direction == "Received":
        what = f"the reply from {where} is {size:,} bytes; this client accepts"
    elif side == "SERVER":
        what = f"the request is {size:,} bytes; {where} accepts"
    elif direction == "Sent":
        what = f"the request is {size:,} bytes; this client sends"
    else:  # gRPC did not say which end refused it
        what = f"a message to or from {where} is {size:,} bytes; gRPC takes"
    return UsageError(f"{what} at most {limit:,} bytes (grpc_message_bytes)")


def _is_connect_failure(details: str) -> bool:
    low = details.lower()
    return any(hint in low for hint in _CONNECT_HINTS)


def _connect_error(details: str, server: str | None) -> BcError:
    where = f"bc serve at {server}" if server else "bc serve"
    low = details.lower()
    ssl = _SSL_REASON.search(details)
    cut_short = ssl is None and any(hint in low for hint, _ in _CONNECTION_REASONS)
    if "handshake" in low and not cut_short:
        # Our side refused the server's certificate: a config for another server, or a stale CA. (A handshake
        # that a reset or a close cut short, with no TLS reason, is a server going away: not answering.)
        # Without OpenSSL's reason, gRPC's own innermost words (e.g. "SSL_ERROR_SYSCALL"): a bare "certificate
        # refused" hid which handshake failure a rare CI failure was.
        reason = ssl.group(1).lower().replace("_", " ") if ssl else f"certificate refused: {_last_reason(details)}"
        return Unauthenticated(
            f"the TLS handshake with {where} failed ({reason}); "
            "are the operator config's CA and certificate this server's?"
        )
    if any(h in low for h in _NAME_HINTS):
        return Unavailable(f"cannot reach {where}: {_last_reason(details)}")
    # Refused, reset, closed: the server is down or restarting. (A server that refuses the operator's
    # certificate also closes the socket; the Admin client tells that apart by asking again itself.)
    return Unavailable(f"{where} is not answering ({_connection_reason(details)})")


def _connection_reason(details: str) -> str:
    low = details.lower()
    for hint, reason in _CONNECTION_REASONS:
        if hint in low:
            return reason
    return _last_reason(details).lower()


def _last_reason(details: str) -> str:
    """grpc's details nest reasons with ': '; the innermost is the one an operator can act on."""
    tail = details.rsplit(": ", 1)[-1].strip(" []")
    return tail or details or "no connection"
