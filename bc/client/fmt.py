"""What the CLI and the TUI both show the same way and that is not terminal output: an instant, in UTC."""

from __future__ import annotations

from datetime import UTC, datetime


def format_time_ms(at_ms: int) -> str:
    """A wall-clock instant (epoch ms) in UTC, to the second."""
    return datetime.fromtimestamp(at_ms / 1000, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
