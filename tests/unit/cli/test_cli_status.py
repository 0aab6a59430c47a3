"""Our error tree on the wire (bc.wire.status): every class comes back as itself."""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from bc.errors import (
    BcError,
    Conflict,
    NotFound,
    ProtocolError,
    Unauthenticated,
    Unavailable,
    UsageError,
)
from bc.wire.status import abort_with, error_to_status, status_to_error

EXPECTED = [
    (BcError, grpc.StatusCode.UNKNOWN),
    (UsageError, grpc.StatusCode.INVALID_ARGUMENT),
    (NotFound, grpc.StatusCode.NOT_FOUND),
    (Conflict, grpc.StatusCode.FAILED_PRECONDITION),
    (Unavailable, grpc.StatusCode.UNAVAILABLE),
    (Unauthenticated, grpc.StatusCode.UNAUTHENTICATED),
    (ProtocolError, grpc.StatusCode.INTERNAL),
]


@pytest.mark.parametrize(("cls", "code"), EXPECTED)
def test_each_error_class_has_its_code(cls: type[BcError], code: grpc.StatusCode) -> None:
    assert error_to_status(cls("the message")) == (code, "the message")


@pytest.mark.parametrize(("cls", "code"), EXPECTED)
def test_each_error_class_round_trips(cls: type[BcError], code: grpc.StatusCode) -> None:
    err = status_to_error(*error_to_status(cls("node n1 is cordoned")), server="127.0.0.1:7443")
    assert type(err) is cls
    assert err.message == "node n1 is cordoned"
    assert err.exit_code == cls.exit_code


def test_every_exit_code_is_distinct_on_the_wire() -> None:
    codes = {error_to_status(cls("x"))[0] for cls, _ in EXPECTED}
    assert len(codes) == len(EXPECTED)


@pytest.mark.parametrize(
    ("code", "cls"),
    [
        (grpc.StatusCode.ALREADY_EXISTS, Conflict),
        (grpc.StatusCode.ABORTED, Conflict),
        (grpc.StatusCode.PERMISSION_DENIED, Unauthenticated),
        (grpc.StatusCode.OUT_OF_RANGE, UsageError),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, Unavailable),
        (grpc.StatusCode.DATA_LOSS, BcError),
    ],
)
def test_other_codes_read_as_the_nearest_class(code: grpc.StatusCode, cls: type[BcError]) -> None:
    err = status_to_error(code, "why")
    assert type(err) is cls and err.message == "why"


def test_deadline_exceeded_is_unavailable_and_names_the_server() -> None:
    err = status_to_error(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded", server="10.0.0.1:7443")
    assert type(err) is Unavailable
    assert err.message == "bc serve at 10.0.0.1:7443 did not answer in time"
    assert err.retryable


def test_connection_refused_says_where() -> None:
    details = (
        "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:7443: "
        "Failed to connect to remote host: Connection refused"
    )
    err = status_to_error(grpc.StatusCode.UNAVAILABLE, details, server="127.0.0.1:7443")
    assert type(err) is Unavailable
    assert err.message == "bc serve at 127.0.0.1:7443 is not answering (connection refused)"


def test_unresolvable_name_says_where() -> None:
    details = "errors resolving nohost:7443: [field:hostname lookup error:address lookup failed: Domain name not found]"
    err = status_to_error(grpc.StatusCode.UNAVAILABLE, details, server="nohost:7443")
    assert err.message == "cannot reach bc serve at nohost:7443: Domain name not found"


def test_a_refused_server_certificate_is_unauthenticated() -> None:
    details = (
        "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:7443: Tls handshake failed "
        "(TSI_PROTOCOL_FAILURE): SSL_ERROR_SSL: error:1000007d:SSL routines:OPENSSL_internal:"
        "CERTIFICATE_VERIFY_FAILED: OK"
    )
    err = status_to_error(grpc.StatusCode.UNAVAILABLE, details, server="127.0.0.1:7443")
    assert type(err) is Unauthenticated
    assert "TLS handshake with bc serve at 127.0.0.1:7443 failed (certificate verify failed)" in err.message


def test_a_handshake_failure_without_an_openssl_reason_keeps_grpcs_own_words() -> None:
    details = (
        "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:7443: Ssl handshake failed "
        "(TSI_PROTOCOL_FAILURE): SSL_ERROR_SSL"
    )
    err = status_to_error(grpc.StatusCode.UNAVAILABLE, details, server="127.0.0.1:7443")
    assert type(err) is Unauthenticated
    assert "failed (certificate refused: SSL_ERROR_SSL)" in err.message


def test_a_server_that_is_unavailable_on_purpose_keeps_its_message() -> None:
    err = status_to_error(grpc.StatusCode.UNAVAILABLE, "the store is read-only", server="h:1")
    assert type(err) is Unavailable and err.message == "the store is read-only"


def test_unimplemented_is_a_contract_mismatch() -> None:
    err = status_to_error(grpc.StatusCode.UNIMPLEMENTED, "Method not found!", server="h:1")
    assert type(err) is ProtocolError
    assert "bc serve at h:1 does not implement this call" in err.message


def test_empty_details_still_make_a_sentence() -> None:
    assert status_to_error(grpc.StatusCode.NOT_FOUND, "").message == "the server failed with NOT_FOUND"


class FakeContext:
    """The one method of grpc.aio.ServicerContext that abort_with uses; aborts raise, as grpc's do."""

    def __init__(self) -> None:
        self.aborted: tuple[Any, str] | None = None

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        self.aborted = (code, details)
        raise grpc.RpcError(details)


async def test_abort_with_aborts_with_the_mapped_status() -> None:
    ctx = FakeContext()
    with pytest.raises(grpc.RpcError):
        await abort_with(ctx, Conflict("no free GPUs on n1"))
    assert ctx.aborted == (grpc.StatusCode.FAILED_PRECONDITION, "no free GPUs on n1")


class ForgetfulContext:
    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        return None


async def test_abort_with_never_returns() -> None:
    with pytest.raises(AssertionError):
        await abort_with(ForgetfulContext(), NotFound("x"))


def test_a_handshake_cut_short_by_a_reset_is_not_answering_not_a_certificate_refusal() -> None:
    # grpc's words when the server's socket resets in the middle of the TLS handshake (a server dying).
    details = (
        "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:7443: "
        "Ssl handshake failed (TSI_PROTOCOL_FAILURE): Connection reset by peer"
    )
    err = status_to_error(grpc.StatusCode.UNAVAILABLE, details, server="127.0.0.1:7443")
    assert isinstance(err, Unavailable)
    assert err.message == "bc serve at 127.0.0.1:7443 is not answering (connection reset)"


def test_a_handshake_the_server_closed_without_a_tls_reason_is_not_answering() -> None:
    # grpc's words when the socket was shut in the middle of the handshake (a loaded server dropping it): the
    # words of a CI failure that had been told as "certificate refused" and exit 6.
    details = (
        "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:41051: "
        "Handshake read failed (Endpoint closing)"
    )
    err = status_to_error(grpc.StatusCode.UNAVAILABLE, details, server="127.0.0.1:41051")
    assert isinstance(err, Unavailable)
    assert err.message == "bc serve at 127.0.0.1:41051 is not answering (connection closed)"
