"""`bc serve --otlp-endpoint`: the control plane's own metrics, exported the way a node exports its own.

The same pipeline as the agent's (bc.otel.export): a manual reader collected
on this process's loop every `--otlp-interval` seconds and exported from a
worker thread, at most 1 MiB buffered while the collector is away.

Metrics (resource `service.name=bc-serve`, `service.instance.id` = the gateway id):

* `bc.server.sessions`: node sessions open on this gateway (gauge);
* `bc.server.events.published`: events committed to the events log by this process (counter);
* `bc.server.clock.offset`: the store's clock minus this process's, in ms (gauge; 0 on SQLite);
* `bc.server.nodes`: nodes by connectivity (`bc.state`), from the store at each export (gauge).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping

from bc.otel.config import OtlpConfig

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
    ) -> None:
        self.cfg, self.gateway_id = cfg, gateway_id
        self.sessions, self.published, self.clock_offset_ms = sessions, published, clock_offset_ms
        self.nodes_by_state = nodes_by_state
        self._nodes: Mapping[str, int] = {}
        self._published_reported = 0
        self.ticks = 0

    async def run(self) -> None:
        from opentelemetry.metrics import CallbackOptions, Observation

        from bc.otel.export import OtlpPipeline

        pipeline = OtlpPipeline(
            self.cfg, {"service.name": "bc-serve", "service.instance.id": self.gateway_id}, asyncio.to_thread
        )
        m = pipeline.meter
        events = m.create_counter("bc.server.events.published", unit="{event}")

        def sessions(_o: CallbackOptions) -> Iterable[Observation]:
            return [Observation(self.sessions())]

        def offset(_o: CallbackOptions) -> Iterable[Observation]:
            value = self.clock_offset_ms()
            return [] if value is None else [Observation(value)]

        def nodes(_o: CallbackOptions) -> Iterable[Observation]:
            return [Observation(n, {"bc.state": state}) for state, n in sorted(self._nodes.items())]

        m.create_observable_gauge("bc.server.sessions", [sessions], unit="{session}")
        m.create_observable_gauge("bc.server.clock.offset", [offset], unit="ms")
        m.create_observable_gauge("bc.server.nodes", [nodes], unit="{node}")
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
                self.ticks += 1
                await pipeline.tick()
        finally:
            await pipeline.close()
