"""The one error tree: who is at fault, whether a retry can help, and the exit code.

    BcError                      exit 1   (our fault, or the world's)
    ├── UsageError               exit 2   the operator's input is wrong; nothing was changed
    ├── NotFound                 exit 3   a named node, reservation or token does not exist
    ├── Conflict                 exit 4   the request contradicts stored state (no capacity, token used)
    ├── Unavailable              exit 5   a peer or the store cannot be reached; a retry may help
    ├── Unauthenticated          exit 6   identity, certificate or token refused
    │   ├── CertificateRevoked   exit 6   a revoked certificate cannot re-join: a new token is needed
    │   ├── RejoinTooLate        exit 6   expired more than 7 days ago: a new token is needed
    │   └── TicketRefused        exit 6   an exec ticket the node (or server) will not honour, with a reason code
    └── ProtocolError            exit 7   a peer broke the contract ("can't handle X in state Y")

The CLI prints `error: <message>` and exits with the code; `--debug` adds the
traceback. The Admin API carries the class as a gRPC status code (see
`bc.wire.status`).
"""

from __future__ import annotations


class BcError(Exception):
    exit_code = 1
    retryable = False

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class UsageError(BcError):
    exit_code = 2


class NotFound(BcError):
    exit_code = 3


class Conflict(BcError):
    exit_code = 4


class Unavailable(BcError):
    exit_code = 5
    retryable = True


class Overloaded(Unavailable):
    """The server is shedding load (a reconnect storm): retry after a back-off, or after `retry_after_ms` when the
    server named it (`bc.gateway.admission`). RESOURCE_EXHAUSTED on the wire."""

    def __init__(self, message: str, retry_after_ms: int | None = None) -> None:
        super().__init__(message)
        self.retry_after_ms = retry_after_ms


class Unauthenticated(BcError):
    exit_code = 6


class CertificateRevoked(Unauthenticated):
    """The node's certificate was revoked: its key re-joins nothing; `bc join --reset --yes` with a new token."""


class RejoinTooLate(Unauthenticated):
    """The node's certificate expired more than 7 days ago (`bc.pki.rejoin`): `bc join --reset --yes` with a new
    token."""


class TicketRefused(Unauthenticated):
    """An exec ticket refused (`bc.pki.exec_tickets`): `reason` is a code the node and the CLI compare
    (`bad-ticket`, `expired`, `wrong-node`, `wrong-sid`, `replayed`, `jti-set-full`, `unknown-key`, ...)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class ProtocolError(BcError):
    exit_code = 7
