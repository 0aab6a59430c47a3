"""Dialing: one session at a time over an injected `dial()`, redialed with full-jitter back-off.

The agent never builds a transport itself. It is handed `dial: Dial`, an
async callable that returns a connected `Link` (production: the gRPC dial of
`agent.session.grpc_dial`, mutual TLS from the identity files; the simulator
and tests: one end of a `bc.seams.network` connection), or raises `LinkClosed` /
`OSError` when it cannot.

After each session the loop decides by codes, never by wording:

=======================================================  ======================================
How the session ended                                    What the loop does
=======================================================  ======================================
the core closed it with `redial=False` (RevocationNotice)  stop: this certificate is done
`LinkClosed.reason` in `closing.CERTIFICATE_IS_DONE`     stop: this certificate is done
  (revoked, an older identity)
welcomed, then ended (cleanly, or its gateway went away)  redial at once, under 1 s of jitter
refused RESOURCE_EXHAUSTED with a retry-after            redial after it (at most 60 s); no back-off step
anything else (refused, superseded, expired, no dial)    redial after the next back-off step,
                                                         or at once when `rotate()` comes first
=======================================================  ======================================

The back-off is full jitter (uniform over [0, min(60 s, 1 s * 2^attempt)]),
drawn from the agent's `random.Random`, so a seed replays the delays. An
overloaded gateway's retry-after (`LinkClosed.retry_after_ms`, from the
status's `bc-retry-after-ms` metadata) is already spread by the gateway over
its queue (`bc.gateway.admission`): the node comes back when the gateway
expects room for it, and a refusal that named its time does not double the
node's back-off, which would leave the unlucky last nodes of a storm waiting
seconds after the gateways had room.
`rotate()` (a renewed certificate) ends the running session, and a dial in
flight when it is called is dropped and redialed, so the next session
presents the new certificate. Between failed dials it also cuts the back-off
short: a node whose certificate expired offline fails its handshakes until
the renewer has re-joined (`agent.renewal`), and then dials at once.

A frame the gateway refused as too large lowers the frame budget for the
sessions that follow (`agent.framing.budget_after_refusal`).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from agent import framing
from agent.session.runner import SessionDeps, SessionEnd, SessionRunner
from agent.session.tunnel_offers import SessionOffers
from bc.protocol import closing
from bc.protocol.limits import LIMITS
from bc.protocol.pb.session_pb2 import GatewayMessage, NodeMessage
from bc.runtime.aio import cancel_and_wait, wait_event
from bc.seams.link import Link, LinkClosed

log = logging.getLogger("agent")

BACKOFF_BASE_S = 1.0
BACKOFF_CAP_S = 60.0
RETRY_AFTER_CAP_S = 60.0
"""The longest retry-after a node honours (a gateway names at most this, `bc.gateway.admission`)."""

Dial = Callable[[], Awaitable[Link[GatewayMessage, NodeMessage]]]
"""Connect to a gateway: a Link ready for the Hello, or `LinkClosed`/`OSError` when it cannot."""


@runtime_checkable
class ClosableDial(Protocol):
    """A dial that holds something between dials (the production dial keeps its channels open)."""

    async def aclose(self) -> None: ...


def backoff_delay(attempt: int, rng: random.Random) -> float:
    """Full jitter: uniform over [0, min(cap, base * 2^attempt)]."""
    return rng.uniform(0, min(BACKOFF_CAP_S, BACKOFF_BASE_S * (2 ** min(attempt, 16))))


def retry_after_s(e: LinkClosed) -> float | None:
    """The delay an overload refusal named, bounded to [0, RETRY_AFTER_CAP_S]; None when it named none."""
    if e.code != "RESOURCE_EXHAUSTED" or e.retry_after_ms is None:
        return None
    return min(RETRY_AFTER_CAP_S, max(0.0, e.retry_after_ms / 1000))


@dataclass(frozen=True)
class Refusal:
    """Why this certificate is done: the loop stopped and must not be started again with it."""

    reason: str


class SessionLoop:
    tunnel_offers = True
    """The tunnels' offers on the session stream (bc.protocol.capabilities.TUNNEL_OFFERS). Turned off only to
    measure or test how a gateway serves an older agent, which opens `NodeTunnels.Listen` (bench.session_mem
    --listen)."""

    def __init__(
        self,
        dial: Dial,
        deps: SessionDeps,
        rng: random.Random,
        stopped: asyncio.Event,
        *,
        frame_budget: int = LIMITS.max_frame_bytes,
        alongside: Callable[[Any, SessionOffers | None], Coroutine[Any, Any, None]] | None = None,
    ) -> None:
        """`alongside`: what runs on a gRPC session's channel for as long as the session (the node's tunnels),
        handed the channel and the session's tunnel offers (`SessionOffers`; None when `tunnel_offers` is off:
        it then opens `NodeTunnels.Listen` itself, as an older agent does)."""
        self.dial, self.deps, self.rng, self.stopped = dial, deps, rng, stopped
        self.alongside = alongside
        self.frame_budget = frame_budget  # lowered only if a gateway refuses a frame as too large
        self.current: SessionRunner | None = None
        self.rotations = 0
        self.sessions_started = 0  # links dialed; every one after the first is a reconnect (telemetry)
        self._last_welcomed = False  # whether the last session was welcomed, when it ended by an exception
        self._rotated = asyncio.Event()  # set by rotate(): wakes a back-off between failed dials

    def rotate(self, why: str) -> None:
        """End the running session, and drop a dial in flight: the next dial reads the identity files anew."""
        self.rotations += 1
        self._rotated.set()
        if self.current is not None:
            self.current.end(why)

    async def run(self) -> Refusal | None:
        """Sessions until the agent stops (None) or its certificate is refused for good (the Refusal)."""
        try:
            return await self._sessions()
        finally:
            if isinstance(self.dial, ClosableDial):  # what the dial kept open goes with the loop
                await self.dial.aclose()

    async def _sessions(self) -> Refusal | None:
        attempt = 0
        while not self.stopped.is_set():
            end: SessionEnd | None = None
            hinted: float | None = None
            rotations = self.rotations
            try:
                end = await self._one()
            except LinkClosed as e:
                log.warning(
                    "event=session.ended code=%s reason=%s details=%s",
                    e.code,
                    closing.name_of(e.reason),
                    e.details,
                )
                if e.reason in closing.CERTIFICATE_IS_DONE:
                    return Refusal(e.details)
                self._after_refusal(e)
                hinted = retry_after_s(e)
            except OSError as e:  # the transport could not be set up (and TimeoutError: no Welcome in time)
                log.warning("event=session.failed error=%s", e)
            except Exception:  # a bug in one session must not end the node's sessions for good: back off, redial
                log.exception("event=session.error")
            if end is not None and end.close is not None and not end.close.redial:
                return Refusal(end.close.reason)
            # A session that was welcomed resets the back-off even when its transport broke (a gateway that
            # died): the node goes to the next gateway within 1 s of jitter, which is what re-homing is.
            welcomed = end.welcomed if end is not None else self._last_welcomed
            if hinted is not None:  # the gateway said when it expects room: no back-off step
                delay = hinted
            else:
                attempt = 0 if welcomed else attempt + 1
                delay = backoff_delay(attempt, self.rng)
            if not welcomed and hinted is None:
                # Dials failing (an expired certificate's handshake, say) while the renewer re-joins: once it
                # has stored a new pair (`rotate`), the next dial goes at once instead of after the back-off.
                if self.rotations != rotations:
                    attempt, delay = 0, 0.0
                log.info("event=session.redial attempt=%d delay_s=%.3f", attempt, delay)
                await self._back_off(delay, rotations)
                continue
            log.info("event=session.redial attempt=%d delay_s=%.3f", attempt, delay)
            await wait_event(self.stopped, delay)
        return None

    async def _back_off(self, delay: float, rotations: int) -> None:
        """Wait `delay`, or less if the agent stops or its certificate is renewed (a rotation) meanwhile."""
        self._rotated.clear()
        if self.rotations != rotations or delay <= 0:
            return
        waits = [asyncio.ensure_future(self.stopped.wait()), asyncio.ensure_future(self._rotated.wait())]
        try:
            await asyncio.wait(waits, timeout=delay, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
            await asyncio.gather(*waits, return_exceptions=True)

    async def _one(self) -> SessionEnd:
        """Dial and run one session to its end."""
        rotations = self.rotations
        self._last_welcomed = False
        link = await self.dial()
        self.sessions_started += 1
        try:
            if self.rotations != rotations:
                # Renewed while this dial used the old pair: redial with the new one, at once.
                return SessionEnd(welcomed=True)
            channel = getattr(link, "channel", None)
            beside_on = self.alongside is not None and channel is not None
            offers = SessionOffers() if beside_on and self.tunnel_offers else None
            runner = SessionRunner(link, self.deps, self.frame_budget, offers)
            self.current = runner
            beside = (
                asyncio.create_task(self.alongside(channel, offers), name="session-alongside")
                if self.alongside is not None and beside_on
                else None
            )
            try:
                return await runner.run()
            finally:
                self._last_welcomed = runner.welcomed
                self.current = None
                if beside is not None:
                    await cancel_and_wait([beside])
        finally:
            await link.close("CANCELLED", "the node ends this session")

    def _after_refusal(self, e: LinkClosed) -> None:
        """A frame refused as too large: pack smaller from now on, so the same frame is never resent."""
        budget = framing.budget_after_refusal(e.code, e.details, self.frame_budget)
        if budget is not None:
            log.error("event=session.frame-refused budget_before=%d budget=%d", self.frame_budget, budget)
            self.frame_budget = budget
        elif e.code == "RESOURCE_EXHAUSTED" and "larger than max" in e.details:
            log.error("event=session.frame-too-large-from-gateway details=%s", e.details)
