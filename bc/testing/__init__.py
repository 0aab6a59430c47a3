"""Wiring for tests: the virtual-time loop, and the in-process harness.

Time in tests is the virtual loop's (`bc.seams.virtual_time`): `virtual_clock()` reads it, `await
advance(s)` lets `s` seconds pass, `run(coro)` runs a program on a fresh loop. The in-memory network and
its links are a product seam (`bc.seams.network`: `SimNetwork`, `link_pair`). `SessionPair` (from
`bc.sim.pair`, loaded on first use: it pulls in the whole control plane and agent) runs a control plane,
a gateway and N agents over that network on that loop. No product module imports this package (an
import contract in pyproject.toml says so).
"""

from __future__ import annotations

from bc.seams.virtual_time import START, WALL_START, VirtualTimeLoop, advance, run, virtual_clock

__all__ = [
    "START",
    "WALL_START",
    "VirtualTimeLoop",
    "advance",
    "run",
    "virtual_clock",
]


def __getattr__(name: str) -> object:
    # Lazily: `from bc.testing import virtual_clock` must not pull in the whole control plane and agent.
    if name == "SessionPair":
        from bc.sim.pair import SessionPair

        return SessionPair
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
