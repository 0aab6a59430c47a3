"""The pure rules of shell typescripts: which tickets the policy allows, and what a record says of its typescript."""

from __future__ import annotations

from typing import Any

import pytest

from bc.control.trust.typescripts import GRACE_MS, check_promise, state
from bc.errors import Conflict, UsageError


def test_the_policy_decides_the_promise() -> None:
    check_promise("off", "shell", False)
    check_promise("optional", "shell", True)
    check_promise("optional", "shell", False)
    check_promise("required", "shell", True)
    check_promise("required", "exec", False)  # only a shell is recorded
    with pytest.raises(Conflict, match="off"):
        check_promise("off", "shell", True)
    with pytest.raises(Conflict, match="required"):
        check_promise("required", "shell", False)
    with pytest.raises(UsageError, match="only a shell"):
        check_promise("optional", "forward", True)


def row(**kw: Any) -> dict[str, Any]:
    base = {"record_promised": 1, "typescript_done": 0, "typescript_bytes": 0, "state": "closed", "ended_at_ms": 1000}
    return {**base, **kw}


def test_what_the_record_says() -> None:
    assert state(row(record_promised=0), 10**9) == ""
    assert state(row(state="open", ended_at_ms=None), 10**9) == "pending"
    assert state(row(), 1000 + GRACE_MS - 1) == "pending"  # ended, within the grace
    assert state(row(), 1000 + GRACE_MS) == "missing"
    assert state(row(typescript_bytes=5), 1000 + GRACE_MS) == "partial"
    assert state(row(typescript_done=1, typescript_bytes=5), 10**9) == "complete"
