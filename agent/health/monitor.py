"""The health pass: read the hardware, apply the rules, keep the conditions. Driven by the converge loop.

Every converge pass (a new spec, and every 10 s) the agent calls `poll`
with the facts only it knows (journal full, clock offset, the last pass's
error, the host units' verdicts); the reading itself runs through the offload seam. XIDs accumulate
per GPU for the boot (an event set reports each once) until `after_reset`
sees the GPU read healthy after a `gpu.reset`. `overlay` marks every GPU
whose `GpuHealthy` is False `healthy: false` in the inventory the agent
reports, which the control plane's capacity treats as NoSchedule for new
holds; existing holds stay (I5).

`last` is the newest reading: the telemetry export's GPU gauges come from it,
so NVML is asked once per pass for both.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from agent.health import rules, xid
from agent.health.conditions import Change, ConditionBook
from agent.health.readings import HealthReading, HealthSource
from agent.offload import Offload
from bc.protocol.pb import common_pb2
from bc.seams.clock import Clock

log = logging.getLogger("agent.health")

MAX_XIDS_PER_GPU = 16


class HealthMonitor:
    def __init__(self, source: HealthSource, clock: Clock, offload: Offload) -> None:
        self.source, self.clock, self.offload = source, clock, offload
        self.book = ConditionBook()
        self.xids: dict[str, list[int]] = {}
        self.last: HealthReading | None = None
        self._journal_full = False
        self._offset_ms: int | None = None
        self._converge_error = ""
        self._host: tuple[rules.Verdict, ...] = ()

    async def poll(
        self,
        *,
        journal_full: bool,
        offset_ms: int | None,
        converge_error: str = "",
        host: Sequence[rules.Verdict] = (),
    ) -> list[Change]:
        """`host`: the host units' verdicts from the last converge pass (agent.converge.host)."""
        self._journal_full, self._offset_ms, self._converge_error = journal_full, offset_ms, converge_error
        self._host = tuple(host)
        reading = await self.offload(self.source.read)
        self._take_xids(reading)
        return self._apply(reading)

    async def after_reset(self, uuids: Sequence[str]) -> dict[str, bool]:
        """Read again after a reset; a GPU that reads healthy loses its XIDs at once. Returns the verdict per GPU."""
        reading = await self.offload(self.source.read)
        by_uuid = {g.uuid: g for g in reading.gpus}
        healthy: dict[str, bool] = {}
        for u in uuids:
            g = by_uuid.get(u)
            healthy[u] = g is not None and rules.reads_healthy(g)
            if healthy[u] and self.xids.pop(u, []):
                log.info("event=health.xids-cleared gpu=%s why=reset-and-reads-healthy", u)
        self._take_xids(reading)
        self._apply(reading)
        return healthy

    def _take_xids(self, reading: HealthReading) -> None:
        for g in reading.gpus:
            for x in g.new_xids:
                if not xid.is_critical(x):
                    log.info("event=health.xid gpu=%s xid=%d critical=false", g.uuid, x)
                    continue
                log.warning("event=health.xid gpu=%s xid=%d critical=true", g.uuid, x)
                held = self.xids.setdefault(g.uuid, [])
                if x not in held:
                    held.append(x)
                    del held[:-MAX_XIDS_PER_GPU]

    def _apply(self, reading: HealthReading) -> list[Change]:
        self.last = reading
        node = [
            rules.clock_skew_verdict(self._offset_ms),
            rules.journal_full_verdict(self._journal_full),
            rules.host_verdict(reading.host),
        ]
        verdicts = [rules.gpu_verdict(g, self.xids.get(g.uuid, [])) for g in reading.gpus]
        verdicts += [*node, rules.node_ready_verdict(node, self._converge_error), *self._host]
        changes = self.book.update(verdicts, self.clock.monotonic())
        for c in changes:
            after = c.after
            log.log(
                logging.WARNING if after is not None and _bad(after) else logging.INFO,
                "event=condition.changed type=%s status=%s reason=%s message=%r",
                c.type,
                after.status if after else "gone",
                after.reason if after else "",
                after.message if after else "",
            )
        return changes

    def unhealthy_gpus(self) -> set[str]:
        out = set()
        for v in self.book.verdicts():
            gpu = rules.gpu_of(v.type)
            if gpu is not None and v.status == "False":
                out.add(gpu)
        return out

    def overlay(self, inv: common_pb2.Inventory) -> None:
        """Mark every GPU whose GpuHealthy is False unhealthy in `inv` (in place)."""
        bad = self.unhealthy_gpus()
        for g in inv.gpus:
            if g.uuid in bad:
                g.healthy = False

    def conditions(self) -> list[common_pb2.Condition]:
        return self.book.report(self.clock.monotonic())


def _bad(v: rules.Verdict) -> bool:
    good_when_true = v.type in rules.GOOD_WHEN_TRUE or rules.gpu_of(v.type) is not None
    return (v.status == "False") if good_when_true else (v.status == "True")
