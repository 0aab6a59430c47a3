"""A node-supplied string cannot forge a server log line.

`bc serve` logs strings nodes send (a hostname, a reason, an error's text)
with `key=%s`. A hostname holding "\\n ts=… event=node.revoked" used to start
a line of its own in the log, read by journald, grep and log shippers as a
record the server never wrote; a bidi override could reorder what a reader
sees. The formatter `bc serve` and `bc node` install (bc.runtime.logs.setup) now
writes every record as one line, those characters escaped, tracebacks too.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from bc.runtime import logs

FORGED = "gpu-7\nts=2026-01-01 level=WARNING proc=serve logger=bc.gateway event=node.revoked node=n2"


@pytest.fixture
def log_file(tmp_path: Path) -> Iterator[Path]:
    root = logging.getLogger()
    saved, level = root.handlers[:], root.level
    path = tmp_path / "serve.log"
    logs.setup("serve", level="INFO", file=path)
    yield path
    for h in root.handlers:
        h.close()
    root.handlers[:], root.level = saved, level


def records(path: Path) -> list[str]:
    for h in logging.getLogger().handlers:
        h.flush()
    return path.read_text().splitlines()


def test_a_newline_in_a_node_string_does_not_start_a_record(log_file: Path) -> None:
    log = logging.getLogger("bc.gateway.sessions")
    log.info("event=node.hello node=%s hostname=%s", "n1", FORGED)
    log.info("event=node.hello node=%s hostname=%s", "n1", "gpu-8\r\u2028event=forged")
    lines = records(log_file)
    assert len(lines) == 2, lines
    assert all(line.startswith("ts=") and "event=node.hello" in line for line in lines)
    assert "hostname=gpu-7\\x0ats=2026-01-01" in lines[0]  # what was sent, made visible
    assert "gpu-8\\x0d\\u2028event=forged" in lines[1]


def test_bidi_overrides_and_escapes_in_the_message_itself_are_escaped(log_file: Path) -> None:
    log = logging.getLogger("bc.control")
    log.warning("event=spec.rejected reason=" + "ok\u202edetacilpmoc\x1b[2J")  # a message built by hand
    [line] = records(log_file)
    assert "\u202e" not in line and "\x1b" not in line
    assert "ok\\u202edetacilpmoc\\x1b[2J" in line


def test_a_traceback_stays_within_its_record(log_file: Path) -> None:
    log = logging.getLogger("bc.serve")
    try:
        raise ValueError(FORGED)
    except ValueError:
        log.exception("event=serve.failed")
    log.info("event=serve.next")
    lines = records(log_file)
    assert len(lines) == 2, lines
    assert "Traceback" in lines[0] and "ValueError: gpu-7\\x0ats=" in lines[0]
