"""Rate-limited logging of the release endpoint's dropped connections: pure counting, the caller logs.

A flood of refused or stalled connections must not become a flood of log lines (a disk filled by a port
scan). The first drop after a quiet interval is reported at once, so an operator sees an attack start;
everything after it in the same interval is counted and reported as one summary line when the interval
ends (`due`, called by the server's flush loop and on each drop).
"""

from __future__ import annotations

from collections import Counter

KINDS = (
    "refused_full",  # every slot busy sending: the newcomer is closed at once
    "refused_per_address",  # its address already holds MAX_PER_ADDRESS connections
    "evicted",  # a connection still without its request head, pushed out by a newcomer at the cap
    "head_timeout",  # no TLS handshake or no full request head within HEAD_TIMEOUT_S
    "bad_request",  # TLS refused, the head too long or not HTTP, the peer gone before its head
    "write_stalled",  # the response made no progress for WRITE_STALL_S
    "not_found",  # 404 and 405: answered, but a scan is as loud as a flood
)


class DropLog:
    def __init__(self, every_s: float, now: float) -> None:
        self.every_s = every_s
        self.counts: Counter[str] = Counter()
        self.total: Counter[str] = Counter()  # since start, for tests and figures
        self._last = now - every_s  # the first drop is reported at once

    def note(self, kind: str, now: float) -> str | None:
        """Count one drop; the summary line to log now, if one is due."""
        self.counts[kind] += 1
        self.total[kind] += 1
        return self.due(now)

    def due(self, now: float) -> str | None:
        if not self.counts or now - self._last < self.every_s:
            return None
        line = " ".join(f"{k}={self.counts[k]}" for k in KINDS if self.counts[k])
        self.counts.clear()
        self._last = now
        return line
