"""Attack: a 20 KiB argument. The server's error quoted it whole in the status details, which gRPC carries
in trailing metadata; over gRPC's metadata limit the client dropped the reply and said exit 5 "unreachable"
("metadata size exceeds hard limit"). Arguments travel in the request body, and the answer's details are
cut to `max_status_bytes`: a long argument is answered (here: not found, or exit 2 naming the limit), never
exit 5."""

from __future__ import annotations

import pytest

from tests.integration.test_cli_cmd import Lab, bc, lab

__all__ = ["lab"]

BIG = "n" * 20 * 1024


@pytest.mark.parametrize(
    ("args", "exit_code"),
    [
        (("nodes", "show", BIG), 3),
        (("cmd", "show", BIG), 3),
        (("cmd", "run", BIG, "inventory.refresh"), 3),
        (("reserve", "--gpus", "1", "--node", BIG), 3),
        (("release", BIG), 3),
        (("reserve", "--gpus", "1", "--tenant", BIG), 2),
    ],
    ids=["nodes-show", "cmd-show", "cmd-run", "reserve-node", "release", "tenant"],
)
def test_a_20_kib_argument_is_answered_not_unreachable(lab: Lab, args: tuple[str, ...], exit_code: int) -> None:
    r = bc(*args)
    assert r.exit_code == exit_code, r.output[:300]
    (line,) = r.stderr.splitlines()
    assert line.startswith("error: ") and "unreachable" not in line and "metadata" not in line, line[:300]
    assert len(line.encode()) < 4096, "the whole argument came back"
