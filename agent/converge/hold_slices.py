"""The devices converger's slice work: make a hold's slice when it is missing or changed, and stop the
slices no hold keeps once nothing runs in them (retried on every pass, so a slice in use goes when its
workload exits). Every effect goes through the slice seam (`agent.hw.slices`); a make that fails raises
(the converger's retryable write error), a stop that fails is logged and tried again on the next pass."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from agent.hw.limits import Limits
from agent.hw.slices import SliceManager

log = logging.getLogger(__name__)


class HoldSlices:
    def __init__(self, slices: SliceManager | None) -> None:
        """`slices` None: nothing is managed (every call is a no-op)."""
        self.slices = slices

    async def ensure(self, name: str, limits: Limits, *, force: bool) -> None:
        """The slice with these limits: applied when `force` (new, or its limits changed) or when it is missing."""
        if self.slices is None or not name:
            return
        if force or not await self.slices.present(name):
            await self.slices.apply(name, limits)
            log.info("event=slice.applied slice=%s", name)

    async def sweep(self, kept: Iterable[str]) -> list[str]:
        """Stop every hold slice not in `kept` whose cgroup is empty; returns the ones stopped."""
        if self.slices is None:
            return []
        keep = set(kept)
        try:
            names = await self.slices.list()
        except OSError as e:
            log.warning("event=slice.list_failed error=%r", str(e))
            return []
        stopped: list[str] = []
        for name in names:
            if name in keep:
                continue
            try:
                if await self.slices.populated(name):
                    log.info("event=slice.kept slice=%s reason=populated", name)
                    continue
                await self.slices.stop(name)
            except OSError as e:
                log.warning("event=slice.stop_failed slice=%s error=%r", name, str(e))
                continue
            log.info("event=slice.stopped slice=%s", name)
            stopped.append(name)
        return stopped
