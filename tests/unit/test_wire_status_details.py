"""What a servicer sends as details is one visible line, whatever the caller put in the message.

Found by the Admin API fuzzer: a batch of kind "\\n" with an oversize payload was refused with
"the \\n payload is …", a newline from the request inside an operator's one-line error.
"""

from __future__ import annotations

import grpc
import pytest

from bc.errors import BcError, NotFound, UsageError
from bc.wire.status import error_to_status, status_to_error


@pytest.mark.parametrize(
    ("message", "details"),
    [
        ("the \n payload is 1,100,000 bytes", "the \\x0a payload is 1,100,000 bytes"),
        ("node \x1b[2Jn1 is unknown", "node \\x1b[2Jn1 is unknown"),
        ("kind \u202eevil", "kind \\u202eevil"),
        ("plain words stay as they are", "plain words stay as they are"),
    ],
)
def test_details_escape_what_would_break_the_line_or_steer_a_terminal(message: str, details: str) -> None:
    code, sent = error_to_status(UsageError(message))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert sent == details
    assert "\n" not in sent and "\x1b" not in sent


@pytest.mark.parametrize("cls", [UsageError, NotFound, BcError])
def test_the_class_still_round_trips_after_escaping(cls: type[BcError]) -> None:
    code, sent = error_to_status(cls("a\tb"))
    back = status_to_error(code, sent)
    assert type(back) is cls
    assert back.message == "a\\x09b"
