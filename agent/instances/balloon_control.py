"""The balloon controller: every 30 s, read the host's memory pressure and resize the balloons of bc's running
guests that have one, as `agent.instances.balloon.plan` says.

Runs beside the converge loop, never inside a pass: a converge pass that
starts or stops guests is not slowed by it, and a balloon resize is not a
change of the spec's state. A guest defined without a balloon device is never
touched (the runtime answers NoBalloon); a guest that stopped between the
pass and this read is skipped. What each balloon takes is kept in
`reclaimed` (InstanceStatus.balloon_mib in the next report). Host admission
still charges every guest its whole memory: a balloon never lets bc start
more guests than fit.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping

from agent.instances.balloon import DEFAULT_FLOOR_PERCENT, INTERVAL_S, BalloonGuest, HostPressure, plan
from agent.instances.runtime import InstanceRuntime, NoBalloon, RuntimeFailure
from bc.runtime.aio import wait_event

log = logging.getLogger(__name__)

Guests = Callable[[], list[tuple[str, str, int]]]
"""The running guests of bc's whose placement asks for a balloon: (runtime, instance id, memory MiB)."""


class BalloonController:
    def __init__(
        self,
        runtimes: Mapping[str, InstanceRuntime],
        guests: Guests,
        pressure: Callable[[], Awaitable[HostPressure | None]],
        floor_percent: int = DEFAULT_FLOOR_PERCENT,
        reclaimed: dict[str, int] | None = None,
    ) -> None:
        if not 10 <= floor_percent <= 100:
            raise ValueError(f"balloon floor {floor_percent} % is not between 10 and 100")
        self.runtimes = dict(runtimes)
        self.guests = guests
        self.pressure = pressure
        self.floor_percent = floor_percent
        self.reclaimed: dict[str, int] = {} if reclaimed is None else reclaimed
        """What each guest's balloon takes from it now, in MiB (only guests that have one); updated in place,
        so the converger's report reads the same dict."""

    async def once(self) -> dict[str, int]:
        """One look: the new `actual` of each balloon it moved."""
        host = await self.pressure()
        if host is None:
            return {}
        readings: list[tuple[str, BalloonGuest]] = []
        seen: dict[str, int] = {}
        for runtime, iid, memory_mib in self.guests():
            rt = self.runtimes.get(runtime)
            if rt is None:
                continue
            try:
                r = await rt.balloon(iid)
            except NoBalloon:
                continue
            except RuntimeFailure as e:  # stopped since the pass, or its QMP did not answer: next time
                log.info("event=instance.balloon-unread instance=%s error=%r", iid, str(e))
                continue
            readings.append((runtime, BalloonGuest(iid, memory_mib, r.actual_mib, r.used_mib)))
            seen[iid] = max(0, memory_mib - r.actual_mib)
        moves = plan(host, [g for _, g in readings], self.floor_percent)
        for runtime, g in readings:
            target = moves.get(g.id)
            if target is None:
                continue
            try:
                await self.runtimes[runtime].set_balloon(g.id, target)
            except RuntimeFailure as e:
                log.warning("event=instance.balloon-failed instance=%s error=%r", g.id, str(e))
                moves.pop(g.id)
                continue
            seen[g.id] = max(0, g.memory_mib - target)
            log.info(
                "event=instance.balloon instance=%s actual_mib=%d was_mib=%d available_mib=%d stall=%.1f",
                g.id,
                target,
                g.actual_mib,
                host.available_mib,
                host.stall_avg10,
            )
        self.reclaimed.clear()
        self.reclaimed.update(seen)
        return moves

    async def run(self, stopped: asyncio.Event, interval_s: float = INTERVAL_S) -> None:
        while not stopped.is_set():
            try:
                await self.once()
            except Exception:  # a balloon pass must never end the agent; the next one retries
                log.exception("event=instance.balloon-pass-failed")
            await wait_event(stopped, interval_s)
