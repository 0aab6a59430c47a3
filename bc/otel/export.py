"""The OTLP pipeline: opentelemetry-sdk instruments, a manual reader, one exporter, a bounded buffer.

The caller's own timer drives it (the agent's loop, `bc serve`'s loop), not
the SDK's `PeriodicExportingMetricReader` thread: `tick()` collects on the
loop (so observable callbacks read the caller's state without locks) and
hands the export to `offload` (a worker thread), one export at a time. An
unreachable collector costs a bounded buffer, never the caller's work:
collected batches wait, oldest first, up to `max_buffer_bytes` (1 MiB) of
encoded OTLP; past that the oldest are dropped and counted. The first
failure logs a warning and the recovery an info line, not one per tick.

Importing this module imports opentelemetry; import it only where telemetry
runs (bc.otel.config is the light half).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, MetricExporter, MetricExportResult, MetricsData
from opentelemetry.sdk.resources import Resource

from bc.otel.config import GRPC, OtlpConfig

log = logging.getLogger("bc.otel")

MAX_BUFFER_BYTES = 1 << 20
Offload = Callable[..., Awaitable[Any]]


def make_exporter(cfg: OtlpConfig, timeout_s: float) -> MetricExporter:
    if cfg.protocol == GRPC:
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as GrpcExporter

        return GrpcExporter(
            endpoint=cfg.endpoint, insecure=not cfg.secure, timeout=timeout_s, headers=dict(cfg.headers) or None
        )
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as HttpExporter

    return HttpExporter(endpoint=cfg.endpoint, timeout=timeout_s, headers=dict(cfg.headers) or None)


class OtlpPipeline:
    def __init__(
        self,
        cfg: OtlpConfig,
        resource: Mapping[str, str],
        offload: Offload = asyncio.to_thread,
        *,
        max_buffer_bytes: int = MAX_BUFFER_BYTES,
        exporter: MetricExporter | None = None,
    ) -> None:
        self.cfg = cfg
        self.offload = offload
        self.reader = InMemoryMetricReader()
        self.provider = MeterProvider(resource=Resource({**resource, **cfg.resource}), metric_readers=[self.reader])
        self.meter = self.provider.get_meter("bc")
        # An export may take its whole timeout; keep it under the interval, so one tick never overlaps the next.
        self.exporter = exporter or make_exporter(cfg, timeout_s=min(10.0, max(1.0, cfg.interval_s * 0.8)))
        self.max_buffer_bytes = max_buffer_bytes
        self._buffer: deque[tuple[int, MetricsData]] = deque()
        self.buffered_bytes = 0
        self.exported = 0
        self.dropped = 0
        self.failing = False
        self._inflight = False

    def _enqueue(self, data: MetricsData) -> None:
        size = encode_metrics(data).ByteSize()
        self._buffer.append((size, data))
        self.buffered_bytes += size
        while self.buffered_bytes > self.max_buffer_bytes and self._buffer:
            old, _ = self._buffer.popleft()
            self.buffered_bytes -= old
            self.dropped += 1

    async def tick(self) -> bool:
        """Collect now and send what is buffered; True when the buffer emptied. Never raises for the collector."""
        data = self.reader.get_metrics_data()
        if data is not None and data.resource_metrics:
            self._enqueue(data)
        if self._inflight:
            return False
        self._inflight = True
        try:
            while self._buffer:
                size, batch = self._buffer[0]
                if not await self.offload(self._export, batch):
                    if not self.failing:
                        log.warning(
                            "event=otlp.export-failed endpoint=%s protocol=%s buffered_bytes=%d",
                            self.cfg.endpoint,
                            self.cfg.protocol,
                            self.buffered_bytes,
                        )
                    self.failing = True
                    return False
                if self._buffer and self._buffer[0][1] is batch:  # not dropped meanwhile by a concurrent tick
                    self._buffer.popleft()
                    self.buffered_bytes -= size
                self.exported += 1
            if self.failing:
                log.info("event=otlp.export-recovered endpoint=%s dropped=%d", self.cfg.endpoint, self.dropped)
            self.failing = False
            return True
        finally:
            self._inflight = False

    def _export(self, batch: MetricsData) -> bool:
        try:
            return self.exporter.export(batch) is MetricExportResult.SUCCESS
        except Exception as e:  # the exporter's own bug or a transport error: the same as a failed export
            log.debug("event=otlp.export-error error=%r", str(e))
            return False

    async def close(self) -> None:
        self.provider.shutdown()
        await self.offload(self.exporter.shutdown)
