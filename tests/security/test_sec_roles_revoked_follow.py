"""Attack: a revoked operator keeps watching the fleet through a `bc events --follow` opened before the
revocation (a stolen key's stream, or a person who left with a terminal open). Revocation ends it: the
subprocess exits 6 within 2 s of `bc operators revoke`, printing why."""

from __future__ import annotations

import queue
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.test_cli_cmd import ok_json
from tests.security.roles_helpers import Lab, bc_argv, bc_env, operator_config, serve_lab


@pytest.fixture
def lab(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Lab]:
    yield from serve_lab(tmp_path, monkeypatch)


def lines_of(stream: object) -> queue.Queue[str]:
    """Each line the subprocess prints, as it prints it (a reader thread; the queue ends with "")."""
    q: queue.Queue[str] = queue.Queue()

    def read() -> None:
        for line in iter(stream.readline, ""):  # type: ignore[attr-defined]
            q.put(line)
        q.put("")

    threading.Thread(target=read, daemon=True).start()
    return q


def test_a_revoked_operators_events_follow_ends_within_2s_with_the_reason(lab: Lab, tmp_path: Path) -> None:
    bob = operator_config(tmp_path, "bob", role="operator")
    follow = subprocess.Popen(
        bc_argv("events", "--follow", "--type", "node.labelled"),
        env=bc_env(tmp_path, bob),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out = lines_of(follow.stdout)
        ok_json("nodes", "label", "n1", "rack=r1")
        first = out.get(timeout=30)  # the stream is open and live: it printed the event
        assert "node.labelled" in first and "n1" in first, first

        ok_json("operators", "revoke", "bob", "--reason", "left the team")
        revoked_at = time.monotonic()
        code = follow.wait(timeout=10)
        took = time.monotonic() - revoked_at
        assert follow.stderr is not None
        err = follow.stderr.read()
        assert code == 6, (code, err)
        assert took <= 2.0, f"the stream ended {took:.2f} s after the revocation"
        assert "operator bob was revoked (left the team)" in err, err
        assert "Traceback" not in err
    finally:
        if follow.poll() is None:
            follow.kill()
            follow.wait(10)
