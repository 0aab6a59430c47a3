"""The release HTTPS endpoint's limits (`bc serve --release-listen`, `bc.api.release_http`), in one place.

The endpoint is public bytes on a port any host can reach, so what it holds for a stranger is bounded: a
connection must finish its TLS handshake and send its request head within `HEAD_TIMEOUT_S`, a response
that makes no progress for `WRITE_STALL_S` is dropped, at most `MAX_CONNECTIONS` are open at once and at
most `MAX_PER_ADDRESS` from one client address. At the overall cap a new connection pushes out the oldest
one that has not sent its request yet (a stalled one), so a flood of idle connections cannot lock a node's
download out; only when every slot is busy sending is the newcomer refused. What is dropped is logged as one
summary line per `LOG_SUMMARY_EVERY_S`, never a line per connection. docs/self-update.md has the table.
"""

from __future__ import annotations

from dataclasses import dataclass

HEAD_TIMEOUT_S = 10.0  # TLS handshake plus the request head, from accept
WRITE_STALL_S = 10.0  # a response write that moves no `WRITE_SLICE` bytes for this long is dropped
WRITE_SLICE = 64 * 1024  # the progress unit of a response write: so the floor is 64 KiB per WRITE_STALL_S
MAX_CONNECTIONS = 128  # open at once, whatever their state
MAX_PER_ADDRESS = 16  # open at once from one client IP address
MAX_HEAD_BYTES = 8 * 1024  # a request head longer than this is dropped
LOG_SUMMARY_EVERY_S = 10.0  # dropped and refused connections: one summary line per interval


@dataclass(frozen=True)
class ReleaseLimits:
    """The limits a `ReleaseServer` runs with: the constants above; tests shorten the timeouts."""

    head_timeout_s: float = HEAD_TIMEOUT_S
    write_stall_s: float = WRITE_STALL_S
    write_slice: int = WRITE_SLICE
    max_connections: int = MAX_CONNECTIONS
    max_per_address: int = MAX_PER_ADDRESS
    max_head_bytes: int = MAX_HEAD_BYTES
    log_summary_every_s: float = LOG_SUMMARY_EVERY_S
