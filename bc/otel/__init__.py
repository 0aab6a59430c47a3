"""OTLP export of our own metrics, shared by `bc node` and `bc serve` (docs/telemetry.md).

`config` is pure and light (the CLI and the agent's converger validate with
it); `export` imports opentelemetry and is imported only where telemetry
runs, so `bc nodes --json` never pays for it.
"""
