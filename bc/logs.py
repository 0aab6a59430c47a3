"""Structured logs: one event per line, key=value, to stderr."""

from __future__ import annotations

import logging
import os
import sys


def setup(component: str, level: str | None = None) -> None:
    lvl = (level or os.environ.get("BC_LOG_LEVEL") or "INFO").upper()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        logging.Formatter(f"ts=%(asctime)s level=%(levelname)s proc={component} logger=%(name)s %(message)s")
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(lvl)
