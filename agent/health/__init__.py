"""GPU and node health: readings from the hardware edge, pure condition rules, and the monitor that joins them.

`readings` is the seam (a `HealthSource` per backend: NVML on a real host,
`agent.hw.fake_faults` under `--fake-hw`), `xid` and `rules` are pure,
`conditions` keeps each condition's age, and `monitor` runs it all on the
agent's converge timer. See docs/health.md.
"""
