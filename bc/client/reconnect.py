"""The one retry policy of every Admin client (the CLI's follows and waits, and `bc tui`).

A client that outlives a `bc serve` restart sees a stretch of "not answering" (an `Outage`):
it tries again after `Backoff.delay(attempt)` (0.2 s, doubling, capped at 2 s, so a server
that is back is found within 2 s of answering), says how long the server has been away and
when the next attempt is, and resumes where it was. The same cap is given to grpc itself
(`CHANNEL_OPTIONS`): a channel left to grpc's defaults (1 s growing 1.6× to 120 s, with
jitter) found a restarted server minutes late.

Pure except the loops (`retrying`, `reopening`, `follow_events`), which take the clock and
the line to say as arguments: tests/unit/cli/test_reconnect_policy.py drives them on a fake
clock, tests/e2e/test_restart_clients.py and tests/tui/test_restart_screens.py across real
restarts.

Only a `Unavailable` error is retried (the server not answering, a stream cut): anything
else (a refused certificate, a bad request, an unknown id) is the answer, and ends the loop.
A write is never retried here: only reads and streams are.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from bc.errors import Overloaded, Unavailable

if TYPE_CHECKING:
    from bc.client.admin import AdminClient
    from bc.protocol.pb import admin_pb2
    from bc.seams.clock import Clock

_T = TypeVar("_T")


@dataclass(frozen=True)
class Backoff:
    """How long to wait before attempt N+1 after N failed ones: `initial_s · factor^(N-1)`, at most `cap_s`."""

    initial_s: float = 0.2
    cap_s: float = 2.0
    factor: float = 2.0

    def delay(self, failed: int) -> float:
        if failed <= 0:
            return 0.0
        return min(self.cap_s, self.initial_s * self.factor ** min(failed - 1, 64))


CLIENT_BACKOFF = Backoff()

CHANNEL_OPTIONS: tuple[tuple[str, int], ...] = (
    # grpc's own reconnect of a channel kept open, capped as ours is (its default grows to 120 s).
    ("grpc.initial_reconnect_backoff_ms", int(CLIENT_BACKOFF.initial_s * 1000)),
    ("grpc.min_reconnect_backoff_ms", int(CLIENT_BACKOFF.initial_s * 1000)),
    ("grpc.max_reconnect_backoff_ms", int(CLIENT_BACKOFF.cap_s * 1000)),
    # A server gone without a word (a host powered off, a dropped route) is noticed within 30 s, not never.
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_timeout_ms", 10_000),
)


@dataclass
class Outage:
    """One stretch of `bc serve` not answering, as a client tells it; times are monotonic seconds."""

    since: float | None = None  # when the first attempt failed; None while the server answers
    attempts: int = 0  # failed attempts in this stretch
    next_at: float | None = None  # when the next attempt starts
    reason: str = ""

    @property
    def down(self) -> bool:
        return self.since is not None

    def failed(self, reason: str, now: float, policy: Backoff = CLIENT_BACKOFF, *, at_least: float = 0.0) -> float:
        """Count a failed attempt; the delay before the next one (also kept as `next_at`)."""
        if self.since is None:
            self.since = now
        self.attempts += 1
        self.reason = reason
        delay = max(policy.delay(self.attempts), at_least)
        self.next_at = now + delay
        return delay

    def recovered(self) -> float | None:
        """The server answered: the stretch is over. How long it lasted (None if there was none)."""
        since, self.since, self.attempts, self.next_at, self.reason = self.since, None, 0, None, ""
        return since

    def describe(self, server: str, now: float) -> str:
        """`bc serve at ADDR is not answering (connection refused) for 12s; next attempt in 2s (attempt 3)`."""
        away = _seconds(now - self.since) if self.since is not None else "0s"
        nxt = _seconds(self.next_at - now) if self.next_at is not None else "0s"
        return (
            f"bc serve at {server} is not answering ({short_reason(self.reason, server)}) for {away};"
            f" next attempt in {nxt} (attempt {self.attempts + 1})"
        )


def short_reason(message: str, server: str = "") -> str:
    """The part of an error message an operator acts on: `connection refused`, not the sentence around it."""
    text = message.split(";")[0].strip()
    marker = "is not answering ("
    if marker in text:
        return text.split(marker, 1)[1].rstrip(")").strip() or "no answer"
    if server and text.startswith(f"cannot reach bc serve at {server}: "):
        return text.split(": ", 1)[1]
    return text or "no answer"


def _seconds(s: float) -> str:
    s = max(0.0, s)
    if s < 10:
        return f"{s:.0f}s" if s >= 1 or s == 0 else "<1s"
    if s < 120:
        return f"{int(s)}s"
    return f"{int(s // 60)}m{int(s % 60):02d}s"


Say = Callable[[str], None]


def _wait_for(err: BaseException) -> float:
    """A server shedding load may name when to come back (`Overloaded.retry_after_ms`)."""
    if isinstance(err, Overloaded) and err.retry_after_ms:
        return err.retry_after_ms / 1000.0
    return 0.0


async def retrying(
    call: Callable[[], Awaitable[_T]],
    clock: Clock,
    say: Say,
    server: str,
    *,
    policy: Backoff = CLIENT_BACKOFF,
) -> _T:
    """`call()` (a read), again after each `Unavailable` with the back-off, until it answers.

    `say` gets one line when the server stops answering, one per attempt, and one when it is back.
    """
    outage = Outage()
    while True:
        try:
            out = await call()
        except Unavailable as e:
            delay = outage.failed(e.message, clock.monotonic(), policy, at_least=_wait_for(e))
            say(outage.describe(server, clock.monotonic()))
            await clock.sleep(delay)
            continue
        if outage.down:
            say(_back(server, outage, clock))
        return out


async def reopening(
    open_stream: Callable[[], AsyncGenerator[_T, None]],
    probe: Callable[[], Awaitable[object]],
    clock: Clock,
    say: Say,
    server: str,
    *,
    policy: Backoff = CLIENT_BACKOFF,
    resuming: Callable[[], str] = str,
) -> AsyncGenerator[_T, None]:
    """The items of `open_stream()`, opened again after each cut with the back-off, until it ends.

    After a cut, `probe()` (a cheap read) must answer before the stream is opened again: a stream
    says nothing until it has an item, and the operator is told the server is back when it is.
    """
    outage = Outage()
    while True:
        try:
            if outage.down:
                await probe()
                say(_back(server, outage, clock, resuming()))
            async with contextlib.aclosing(open_stream()) as stream:
                async for item in stream:
                    yield item
            return  # the server ended the stream itself (it never does while it runs): so do we
        except Unavailable as e:
            delay = outage.failed(e.message, clock.monotonic(), policy, at_least=_wait_for(e))
            say(outage.describe(server, clock.monotonic()))
            await clock.sleep(delay)


async def follow_events(
    client: AdminClient,
    clock: Clock,
    say: Say,
    *,
    after_seq: int = 0,
    type_prefix: str = "",
    policy: Backoff = CLIENT_BACKOFF,
) -> AsyncGenerator[admin_pb2.EventRecord, None]:
    """`Watch` from `after_seq`, across restarts: after a cut it resumes after the last event it yielded.

    Seqs only grow, so an event at or below that one (a server replaying) is dropped: each event once.
    """
    cursor = after_seq

    def watch() -> AsyncGenerator[admin_pb2.EventRecord, None]:
        return client.watch(after_seq=cursor, type_prefix=type_prefix)

    def resuming() -> str:
        return f"; resuming after event {cursor}"

    stream = reopening(watch, lambda: client.server_info(), clock, say, client.server, policy=policy, resuming=resuming)
    async with contextlib.aclosing(stream) as evs:
        async for ev in evs:
            if ev.seq <= cursor:
                continue
            cursor = ev.seq
            yield ev


def _back(server: str, outage: Outage, clock: Clock, tail: str = "") -> str:
    since = outage.recovered()
    away = _seconds(clock.monotonic() - since) if since is not None else "0s"
    return f"bc serve at {server} is answering again (after {away}){tail}"
