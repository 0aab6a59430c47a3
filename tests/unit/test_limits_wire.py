"""A message over gRPC's size limit is bad input (exit 2) naming the limit, never "unreachable" (exit 5).

The details strings are gRPC's own, as grpcio reports them (each was seen from a
real channel: see tests/integration/test_limits_inprocess.py for the live ones).
"""

from __future__ import annotations

import grpc
import pytest

from bc.errors import Unavailable, UsageError
from bc.wire.status import status_to_error

SERVER = "127.0.0.1:7443"


@pytest.mark.parametrize(
    ("details", "message"),
    [
        (
            "SERVER: Received message larger than max (6291470 vs. 4194304)",
            "the request is 6,291,470 bytes; bc serve at 127.0.0.1:7443 accepts at most 4,194,304 bytes"
            " (grpc_message_bytes)",
        ),
        (
            "CLIENT: Sent message larger than max (6291470 vs. 4194304)",
            "the request is 6,291,470 bytes; this client sends at most 4,194,304 bytes (grpc_message_bytes)",
        ),
        (
            "Stream removed (CLIENT: Received message larger than max (6291500 vs. 4194304))",
            "the reply from bc serve at 127.0.0.1:7443 is 6,291,500 bytes; this client accepts at most"
            " 4,194,304 bytes (grpc_message_bytes)",
        ),
        (
            "Received message larger than max (5000000 vs. 4194304)",
            "a message to or from bc serve at 127.0.0.1:7443 is 5,000,000 bytes; gRPC takes at most 4,194,304 bytes"
            " (grpc_message_bytes)",
        ),
    ],
)
def test_a_message_over_the_limit_is_a_usage_error_naming_it(details: str, message: str) -> None:
    err = status_to_error(grpc.StatusCode.RESOURCE_EXHAUSTED, details, server=SERVER)
    assert type(err) is UsageError
    assert err.exit_code == 2
    assert err.message == message


def test_any_other_resource_exhausted_is_load_shedding_and_may_be_retried() -> None:
    err = status_to_error(grpc.StatusCode.RESOURCE_EXHAUSTED, "too many Hellos in flight; retry", server=SERVER)
    assert type(err) is Unavailable
    assert err.retryable and err.exit_code == 5
