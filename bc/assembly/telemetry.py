"""`bc serve --otlp-endpoint`: the control plane's own metrics, exported the way a node exports its own.

The same pipeline as the agent's (bc.otel.export): a manual reader collected
on this process's loop every `--otlp-interval` seconds and exported from a
worker thread, at most 1 MiB buffered while the collector is away.

Metrics (resource `service.name=bc-serve`, `service.instance.id` = the gateway id):

* `bc.server.sessions`: node sessions open on this gateway (gauge);
* `bc.server.events.published`: events committed to the events log by this process (counter);
* `bc.server.clock.offset`: the store's clock minus this process's, in ms (gauge; 0 on SQLite);
* `bc.server.nodes`: nodes by connectivity (`bc.state`), from the store at each export (gauge);
* `bc.server.loop.restarts`: restarts of each supervised loop (`bc.loop`) since start (counter);
* `bc.server.loop.restarting`: 1 for each loop (`bc.loop`) waiting to restart after it raised, else 0 (gauge).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from bc.assembly.supervisor import RESTARTING, LoopState
from bc.otel.config import OtlpConfig

if TYPE_CHECKING:
    from opentelemetry.sdk.metrics.export import MetricExporter

    from bc.otel.export import Offload

log = logging.getLogger("bc.serve.telemetry")


class ServeTelemetry:
    def __init__(
        self,
        cfg: OtlpConfig,
        gateway_id: str,
        sessions: Callable[[], int],
        published: Callable[[], int],
        clock_offset_ms: Callable[[], int | None],
        nodes_by_state: Callable[[], Awaitable[Mapping[str, int]]],
        loops: Callable[[], Sequence[LoopState]] = list,
        *,
        exporter: MetricExporter | None = None,
        offload: Offload = asyncio.to_thread,
    ) -> None:
        self.cfg, self.gateway_id = cfg, gateway_id
        self.sessions, self.published, self.clock_offset_ms = sessions, published, clock_offset_ms
        self.nodes_by_state = nodes_by_state
        self.loops = loops
        self.exporter, self.offload = exporter, offload  # a test's in-memory exporter, on its virtual loop
        self._nodes: Mapping[str, int] = {}
        self._published_reported = 0
        self._restarts_reported: dict[str, int] = {}
        self.ticks = 0

    async def run(self) -> None:
        from opentelemetry.metrics import CallbackOptions, Observation

        from bc.otel.export import OtlpPipeline

        pipeline = OtlpPipeline(
            self.cfg,
            {"service.name": "bc-serve", "service.instance.id": self.gateway_id},
            self.offload,
            exporter=self.exporter,
        )
        m = pipeline.meter
        events = m.create_counter("bc.server.events.published", unit="{event}")
        restarts = m.create_counter("bc.server.loop.restarts", unit="{restart}")

        def sessions(_o: CallbackOptions) -> Iterable[Observation]:
            return [Observation(self.sessions())]

        def offset(_o: CallbackOptions) -> Iterable[Observation]:
            value = self.clock_offset_ms()
            return [] if value is None else [Observation(value)]

        def nodes(_o: CallbackOptions) -> Iterable[Observation]:
            return [Observation(n, {"bc.state": state}) for state, n in sorted(self._nodes.items())]

        m.create_observable_gauge("bc.server.sessions", [sessions], unit="{session}")
        m.create_observable_gauge("bc.server.clock.offset", [offset], unit="ms")

        def restarting(_o: CallbackOptions) -> Iterable[Observation]:
            return [Observation(int(s.state == RESTARTING), {"bc.loop": s.name}) for s in self.loops()]

        m.create_observable_gauge("bc.server.nodes", [nodes], unit="{node}")
        m.create_observable_gauge("bc.server.loop.restarting", [restarting], unit="{loop}")
        log.info("event=telemetry.configured endpoint=%s protocol=%s", self.cfg.endpoint, self.cfg.protocol)
        try:
            while True:
                await asyncio.sleep(self.cfg.interval_s)
                try:
                    self._nodes = await self.nodes_by_state()
                except Exception as e:  # the store is away: export what this process knows
                    log.debug("event=telemetry.nodes-unread error=%r", str(e))
                published = self.published()
                if published > self._published_reported:
                    events.add(published - self._published_reported)
                    self._published_reported = published
                self.add_restarts(restarts.add)
                self.ticks += 1
                await pipeline.tick()
        finally:
            await pipeline.close()

    def add_restarts(self, add: Callable[[int, Mapping[str, str]], None]) -> None:
        """Add each loop's restarts since the last export to the counter (`add(delta, {"bc.loop": name})`)."""
        for s in self.loops():
            delta = s.restarts - self._restarts_reported.get(s.name, 0)
            if delta > 0:
                add(delta, {"bc.loop": s.name})
                self._restarts_reported[s.name] = s.restarts
