"""The export loop: on the agent's timer, record the agent's metrics into the SDK and export them.

Metric names and attributes (docs/telemetry.md has the table):

* `bc.agent.commands` (counter; `bc.lane`, `bc.kind`, `bc.state`) and
  `bc.agent.command.duration` (histogram, s, accepted to settled; `bc.lane`, `bc.kind`);
* `bc.agent.journal.size` (By), `bc.agent.journal.unacked_events`;
* `bc.agent.session.connected` (0 or 1), `bc.agent.session.reconnects` (counter);
* `bc.agent.converge.duration` (histogram, s; `bc.section`);
* per GPU (`gpu.uuid`, `gpu.index`): `bc.gpu.utilization` (%), `bc.gpu.memory.used` (By),
  `bc.gpu.temperature` (Cel), `bc.gpu.power` (W), `bc.gpu.ecc.errors` (`ecc.type`
  corrected|uncorrected, `ecc.counter` volatile|aggregate).

The resource carries `service.name=bc-node`, `service.instance.id` and
`bc.node_id` (the node id), then the section's resource attributes.
Collection runs on the loop (the callbacks read a snapshot taken just before);
the export runs through the agent's offload seam. Telemetry is off under
`bc sim`: the simulator builds its agents without this loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any

from agent.offload import Offload
from agent.telemetry.metrics import AgentMetrics, Gauges
from bc.otel.config import OtlpConfig
from bc.runtime.aio import wait_event

if TYPE_CHECKING:
    from bc.otel.export import OtlpPipeline

log = logging.getLogger("agent.telemetry")


class TelemetryLoop:
    def __init__(
        self,
        node_id: str,
        metrics: AgentMetrics,
        gauges: Callable[[], Awaitable[Gauges]],
        offload: Offload,
    ) -> None:
        self.node_id, self.metrics, self.gauges, self.offload = node_id, metrics, gauges, offload
        self.config: OtlpConfig | None = None
        self.pipeline: OtlpPipeline | None = None
        self.changed = asyncio.Event()
        self._snapshot = Gauges()
        self._reconnects_reported = 0
        self._commands_reported: dict[tuple[str, str, str], int] = {}
        self.ticks = 0

    def configure(self, cfg: OtlpConfig | None) -> None:
        """The converger's say: export to `cfg` from now on, or nowhere. The loop applies it before its next tick."""
        if cfg != self.config:
            self.config = cfg
            self.changed.set()

    async def run(self, stopped: asyncio.Event) -> None:
        try:
            while not stopped.is_set():
                self.changed.clear()
                await self._apply()
                if self.pipeline is None:
                    await wait_event(self.changed, 3600.0)
                    continue
                if await wait_event(self.changed, self.pipeline.cfg.interval_s):
                    continue  # reconfigured: apply before exporting anywhere
                try:
                    await self.tick()
                except Exception:  # telemetry must never take the agent down
                    log.exception("event=telemetry.tick-failed")
        finally:
            await self._close()

    async def _apply(self) -> None:
        if self.pipeline is not None and self.pipeline.cfg == self.config:
            return
        await self._close()
        if self.config is None:
            return
        from bc.otel.export import OtlpPipeline  # opentelemetry is loaded only once telemetry is configured

        resource = {"service.name": "bc-node", "service.instance.id": self.node_id, "bc.node_id": self.node_id}
        self.pipeline = OtlpPipeline(self.config, resource, self.offload)
        self._register(self.pipeline)
        log.info(
            "event=telemetry.configured endpoint=%s protocol=%s interval_s=%g",
            self.config.endpoint,
            self.config.protocol,
            self.config.interval_s,
        )

    async def _close(self) -> None:
        if self.pipeline is not None:
            pipeline, self.pipeline = self.pipeline, None
            try:
                await pipeline.close()
            except Exception:
                log.exception("event=telemetry.close-failed")

    async def tick(self) -> bool:
        """One export: take the gauges, record what waited, collect and send. True when everything went out."""
        assert self.pipeline is not None
        self._snapshot = await self.gauges()
        commands, converge = self.metrics.drain()
        for lane, kind, seconds in commands:
            self._command_duration.record(seconds, {"bc.lane": lane, "bc.kind": kind})
        for section, seconds in converge:
            self._converge_duration.record(seconds, {"bc.section": section})
        for key, total in self.metrics.commands.items():
            delta = total - self._commands_reported.get(key, 0)
            if delta:
                lane, kind, state = key
                self._commands.add(delta, {"bc.lane": lane, "bc.kind": kind, "bc.state": state})
                self._commands_reported[key] = total
        reconnects = max(0, self._snapshot.sessions_started - 1)
        if reconnects > self._reconnects_reported:
            self._reconnects.add(reconnects - self._reconnects_reported)
            self._reconnects_reported = reconnects
        self.ticks += 1
        return await self.pipeline.tick()

    def _register(self, pipeline: OtlpPipeline) -> None:
        from opentelemetry.metrics import CallbackOptions, Observation

        m = pipeline.meter
        self._commands_reported = {}
        self._reconnects_reported = 0
        self._commands = m.create_counter("bc.agent.commands", unit="{command}", description="Commands settled")
        self._command_duration = m.create_histogram(
            "bc.agent.command.duration", unit="s", description="From accepted to settled"
        )
        self._converge_duration = m.create_histogram(
            "bc.agent.converge.duration", unit="s", description="One converge pass over one section"
        )
        self._reconnects = m.create_counter("bc.agent.session.reconnects", unit="{session}")

        def one(value: Callable[[Gauges], float]) -> Callable[[CallbackOptions], Iterable[Observation]]:
            return lambda _o: [Observation(value(self._snapshot))]

        def per_gpu(attr: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
            def cb(_o: CallbackOptions) -> Iterable[Observation]:
                out = []
                for i, g in enumerate(self._snapshot.gpus):
                    v = getattr(g, attr)
                    if v is not None:
                        out.append(Observation(v, {"gpu.uuid": g.uuid, "gpu.index": i}))
                return out

            return cb

        def ecc(_o: CallbackOptions) -> Iterable[Observation]:
            out = []
            for i, g in enumerate(self._snapshot.gpus):
                for etype in ("corrected", "uncorrected"):
                    for counter in ("volatile", "aggregate"):
                        v = getattr(g, f"ecc_{counter}_{etype}")
                        if v is not None:
                            attrs: dict[str, Any] = {
                                "gpu.uuid": g.uuid,
                                "gpu.index": i,
                                "ecc.type": etype,
                                "ecc.counter": counter,
                            }
                            out.append(Observation(v, attrs))
            return out

        m.create_observable_gauge("bc.agent.journal.size", [one(lambda s: s.journal_bytes)], unit="By")
        m.create_observable_gauge("bc.agent.journal.unacked_events", [one(lambda s: s.unacked_events)], unit="{event}")
        m.create_observable_gauge("bc.agent.session.connected", [one(lambda s: int(s.session_connected))])
        m.create_observable_gauge("bc.gpu.utilization", [per_gpu("utilization_pct")], unit="%")
        m.create_observable_gauge("bc.gpu.memory.used", [per_gpu("memory_used_bytes")], unit="By")
        m.create_observable_gauge("bc.gpu.temperature", [per_gpu("temperature_c")], unit="Cel")
        m.create_observable_gauge("bc.gpu.power", [per_gpu("power_w")], unit="W")
        m.create_observable_gauge("bc.gpu.ecc.errors", [ecc], unit="{error}")
