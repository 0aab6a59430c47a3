"""Structured logs: one event per line, key=value, to stderr."""

from __future__ import annotations

import logging
import logging.handlers
import os
import sys
from pathlib import Path


def setup(component: str, level: str | None = None, file: Path | None = None) -> None:
    """stderr always (journald takes it under systemd); a size-capped file too when asked (logs.collect)."""
    lvl = (level or os.environ.get("BC_LOG_LEVEL") or "INFO").upper()
    fmt = logging.Formatter(f"ts=%(asctime)s level=%(levelname)s proc={component} logger=%(name)s %(message)s")
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if file is not None:
        file.parent.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.handlers.RotatingFileHandler(file, maxBytes=16 * 1024 * 1024, backupCount=2))
    for h in handlers:
        h.setFormatter(fmt)
    root = logging.getLogger()
    root.handlers[:] = handlers
    root.setLevel(lvl)
