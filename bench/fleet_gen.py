"""The fleet generator: one process of `bench.light_agents_proc` that also measures itself, for `bench.fleet`.

    python -m bench.fleet_gen ROOT FIRST END [START_RATE]

The agents are `bench.light_agents`' (the production `Agent`: session core, journal rules, real gRPC with
mutual TLS to the gateways it joined with; fake hardware and a memory journal), on this process's one event
loop, as `bench.light_agents_proc` runs them and with its commands (`ready N`, `status EVERY FOR`, `stop`).
Two more, one line each way:

* `cpu` -> one JSON line: this process's CPU seconds since it started (`getrusage(RUSAGE_SELF)`, all its
  threads: grpc's own included), the agents connected now, and the session ends counted so far by code
  (`refused_retry_after`: RESOURCE_EXHAUSTED with a retry-after, the gateway's admission shedding load;
  `refused_for_good`: an agent whose session loop gave up, which must stay 0). The parent takes two of
  these around a window and divides by sessions x seconds: the client's CPU per session-second, so the
  gateways' figures can be read apart from the generator's.
* `storm` -> every agent's session ended at once (`SessionLoop.rotate`, the path a renewed certificate
  takes: the node redials at once under 1 s of jitter, over the channel it keeps), then one JSON line once
  every agent is welcomed again: `back_s`, the seconds until the last one was (-1 if some were not within
  `STORM_TIMEOUT_S`), and the counters above.

The counters come from the agents' own log records (`event=session.ended code=...`, a warning; the agents
log nothing else below an error here), through a handler that counts and prints nothing.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
from collections import Counter
from pathlib import Path

from agent.app import Agent
from bench.light_agents_proc import raise_fd_limit, run
from bench.throughput import self_cpu_s  # getrusage(RUSAGE_SELF): all of this process's threads

STORM_TIMEOUT_S = 600.0


class EndCounter(logging.Handler):
    """Counts the agents' `event=session.ended` records by their code, and the sessions given up for good."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.codes: Counter[str] = Counter()
        self.given_up = 0

    def emit(self, record: logging.LogRecord) -> None:
        msg = str(record.msg)
        if msg.startswith("event=session.ended") and record.args:
            self.codes[str(record.args[0])] += 1  # type: ignore[index]
        elif msg.startswith("event=agent.revoked"):
            self.given_up += 1

    def doc(self) -> dict[str, int]:
        return {
            "refused_retry_after": self.codes["RESOURCE_EXHAUSTED"],
            "closed_or_refused": sum(self.codes.values()),
            "refused_for_good": self.given_up,
        }


class Generator:
    """The generator's two commands over the agents `bench.light_agents_proc.run` holds."""

    def __init__(self, ends: EndCounter) -> None:
        self.ends = ends

    def report(self, agents: list[Agent]) -> dict[str, float]:
        return {
            "cpu_s": self_cpu_s(),
            "agents": len(agents),
            "connected": sum(1 for a in agents if a.connected.is_set()),
            **self.ends.doc(),
        }

    async def storm(self, agents: list[Agent]) -> dict[str, float]:
        t0 = time.monotonic()
        for a in agents:
            if a.sessions is not None:
                a.sessions.rotate("bench-storm")
                # The old session clears it too once it has ended; cleared here, at the storm, the next set is
                # the new session's Welcome (nothing else sets it), so waiting on the event needs no polling.
                a.connected.clear()
        try:
            await asyncio.wait_for(asyncio.gather(*(a.connected.wait() for a in agents)), STORM_TIMEOUT_S)
        except TimeoutError:  # not all back: said as such (`connected` tells how many are), not a crash
            return {"back_s": -1.0, **self.report(agents)}
        return {"back_s": time.monotonic() - t0, **self.report(agents)}

    async def on_line(self, line: str, agents: list[Agent]) -> str | None:
        if line == "cpu":
            return json.dumps(self.report(agents))
        if line == "storm":
            return json.dumps(await self.storm(agents))
        return None


def main() -> None:
    raise_fd_limit()
    root, first, end = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    start_rate = float(sys.argv[4]) if len(sys.argv) > 4 else 0.0
    logging.basicConfig(level=logging.ERROR)  # the storm being measured is routine for these agents
    ends = EndCounter()
    agent_log = logging.getLogger("agent")
    agent_log.setLevel(logging.WARNING)
    agent_log.propagate = False  # counted, not printed: errors still print through this handler's sibling
    errors = logging.StreamHandler()
    errors.setLevel(logging.ERROR)
    agent_log.addHandler(errors)
    agent_log.addHandler(ends)
    asyncio.run(run(root, first, end, start_rate, Generator(ends).on_line))


if __name__ == "__main__":
    main()
