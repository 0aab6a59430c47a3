"""Pure formatting for the TUI: ages and unknowns.

A value the server did not give shows `n/a`, never a zero that looks healthy.
"""

from __future__ import annotations

NA = "n/a"


def age(ms: int | None) -> str:
    """A short age: 42s, 5m, 3h, 2d; None or negative (unknown) is n/a."""
    if ms is None or ms < 0:
        return NA
    s = ms // 1000
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m"
    if s < 86400:
        return f"{s // 3600}h"
    return f"{s // 86400}d"


def count(n: int | None) -> str:
    return NA if n is None else str(n)


def clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(0, width - 1)] + "…"
