"""Structured logs: one event per line, key=value, to stderr.

Log lines carry strings nodes and operators supplied (a hostname, a reason),
and a reader (journald, grep, a log shipper) takes each line for one record.
So the formatter writes every record on one line: control, bidi and line
separator characters of the rendered record — its message with its args,
and a traceback if any — are written as visible escapes
(`bc.protocol.text_safety.one_line`), and a hostname holding "\\n event=forged"
cannot forge a record of its own.
"""

from __future__ import annotations

import logging
import logging.handlers
import os
import sys
from pathlib import Path

from bc.protocol.text_safety import one_line


class OneLineFormatter(logging.Formatter):
    """A Formatter whose every record is exactly one line, unsafe characters escaped."""

    def format(self, record: logging.LogRecord) -> str:
        return one_line(super().format(record))


def formatter(component: str) -> logging.Formatter:
    return OneLineFormatter(f"ts=%(asctime)s level=%(levelname)s proc={component} logger=%(name)s %(message)s")


def setup(component: str, level: str | None = None, file: Path | None = None) -> None:
    """stderr always (journald takes it under systemd); a size-capped file too when asked (logs.collect)."""
    lvl = (level or os.environ.get("BC_LOG_LEVEL") or "INFO").upper()
    fmt = formatter(component)
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if file is not None:
        file.parent.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.handlers.RotatingFileHandler(file, maxBytes=16 * 1024 * 1024, backupCount=2))
    for h in handlers:
        h.setFormatter(fmt)
    root = logging.getLogger()
    root.handlers[:] = handlers
    root.setLevel(lvl)
