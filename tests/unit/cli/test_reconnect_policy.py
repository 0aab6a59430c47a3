"""The clients' one retry policy (`bc.client.reconnect`), on a fake clock: the back-off, what an outage says,
and a follow that resumes after the last event it yielded (none twice, none skipped)."""

from __future__ import annotations

from collections.abc import AsyncGenerator

from bc.client.reconnect import CHANNEL_OPTIONS, Backoff, Outage, follow_events, retrying, short_reason
from bc.errors import NotFound, Unavailable
from bc.protocol.pb import admin_pb2


class FakeClock:
    def __init__(self) -> None:
        self.t = 100.0
        self.slept: list[float] = []

    def now(self) -> float:
        return self.t

    def monotonic(self) -> float:
        return self.t

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.t += seconds


def test_the_back_off_doubles_from_0_2_s_and_is_capped_at_2_s() -> None:
    b = Backoff()
    assert [b.delay(n) for n in range(1, 8)] == [0.2, 0.4, 0.8, 1.6, 2.0, 2.0, 2.0]
    assert b.delay(10_000) == 2.0


def test_grpc_s_own_reconnect_back_off_is_capped_the_same() -> None:
    opts = dict(CHANNEL_OPTIONS)
    assert opts["grpc.max_reconnect_backoff_ms"] == 2000
    assert opts["grpc.initial_reconnect_backoff_ms"] == 200


def test_an_outage_says_how_long_the_server_is_away_and_when_the_next_attempt_is() -> None:
    o = Outage()
    reason = "bc serve at h:1 is not answering (connection refused)"
    assert o.failed(reason, 10.0) == 0.2
    assert o.failed(reason, 10.2) == 0.4
    assert o.describe("h:1", 12.0) == (
        "bc serve at h:1 is not answering (connection refused) for 2s; next attempt in 0s (attempt 3)"
    )
    assert o.failed(reason, 40.0, at_least=5.0) == 5.0  # a server shedding load named when to come back
    assert o.describe("h:1", 41.0) == (
        "bc serve at h:1 is not answering (connection refused) for 31s; next attempt in 4s (attempt 4)"
    )
    assert o.recovered() == 10.0 and not o.down and o.attempts == 0


def test_short_reason_keeps_what_an_operator_acts_on() -> None:
    assert short_reason("bc serve at h:1 is not answering (connection reset)", "h:1") == "connection reset"
    assert short_reason("cannot reach bc serve at h:1: Domain name not found", "h:1") == "Domain name not found"
    assert short_reason("the event stream ended; more") == "the event stream ended"


class FlakyAdmin:
    """A `watch` that breaks after some events, the first time only; seqs come from one log."""

    server = "h:1"

    def __init__(self, log: list[int], break_after: int) -> None:
        self.log, self.break_after = log, break_after
        self.asked: list[int] = []
        self.down_for = 2  # server_info fails this many times after the break

    async def server_info(self) -> admin_pb2.ServerInfoResponse:
        if self.down_for:
            self.down_for -= 1
            raise Unavailable("bc serve at h:1 is not answering (connection refused)")
        return admin_pb2.ServerInfoResponse()

    async def watch(self, *, after_seq: int = 0, type_prefix: str = "") -> AsyncGenerator[admin_pb2.EventRecord, None]:
        self.asked.append(after_seq)
        first = len(self.asked) == 1
        # A server may replay from before the cursor: the follow must not print those again.
        for n, seq in enumerate(s for s in self.log if s > after_seq - 2):
            if first and n == self.break_after:
                raise Unavailable("bc serve at h:1 is not answering (connection closed)")
            yield admin_pb2.EventRecord(seq=seq, type="t")


async def test_a_follow_resumes_after_the_last_event_yielded_each_once() -> None:
    clock, said = FakeClock(), []
    admin = FlakyAdmin(list(range(1, 11)), break_after=4)
    got = []
    async for ev in follow_events(admin, clock, said.append, after_seq=0):  # type: ignore[arg-type]
        got.append(ev.seq)
        if ev.seq == 10:
            break
    assert got == list(range(1, 11))
    assert admin.asked == [0, 4]
    assert clock.slept == [0.2, 0.4, 0.8]  # the cut, then two refused probes
    assert said[0].startswith("bc serve at h:1 is not answering (connection closed) for 0s; next attempt in <1s")
    assert said[-1] == "bc serve at h:1 is answering again (after 1s); resuming after event 4"


async def test_retrying_retries_only_a_server_that_is_not_answering() -> None:
    clock, said = FakeClock(), []
    calls = []

    async def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise Unavailable("bc serve at h:1 is not answering (connection refused)")
        return "ok"

    assert await retrying(flaky, clock, said.append, "h:1") == "ok"
    assert len(said) == 3 and said[-1].startswith("bc serve at h:1 is answering again")

    async def missing() -> str:
        raise NotFound("no command named c1")

    try:
        await retrying(missing, clock, said.append, "h:1")
    except NotFound:
        pass
    else:
        raise AssertionError("a NotFound was retried")
