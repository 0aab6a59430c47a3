"""The agent's own metrics over OTLP, configured by the NodeSpec's `telemetry` section (docs/telemetry.md).

`metrics` records (no opentelemetry import), `loop` exports on the agent's
timer through `bc.otel.export` (imported only once a section names an
endpoint), `converger` turns the section into the loop's configuration.
"""
