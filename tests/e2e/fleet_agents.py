"""Many real agents in one helper process, for the fleet-sized end-to-end tests on a 2-core machine.

`python -m tests.e2e.fleet_agents PLAN.json` joins every node of the plan (`agent.join.join_node`, through
its own ordered list of gateway addresses) and runs `agent.app.Agent` for each on fake hardware until
SIGTERM: the agents' real code (sessions over gRPC and mutual TLS, journals, re-homing), sharing one event
loop instead of one process each. The plan is `{"heartbeat_s": 1.0, "nodes": [{"node_id", "data_dir",
"servers", "token"}]}`. It writes `<data_dir>/joined` once a node has joined, and logs to stderr.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from pathlib import Path
from typing import Any

from agent.app import Agent, AgentOptions
from agent.join import join_node
from bc.errors import Unavailable
from bc.runtime import logs

JOIN_TRIES = (0.5, 1.0, 2.0, 4.0)
"""Back-off between join attempts on an unreachable gateway. A refused token (Unauthenticated) is final: every
process trusts the install's one join root from its start, so a new token never waits for a gateway to learn it."""


async def _join(node: dict[str, Any], sem: asyncio.Semaphore) -> None:
    data_dir = Path(node["data_dir"])
    async with sem:
        for wait in (*JOIN_TRIES, None):
            try:
                await join_node(node["servers"], node["token"], data_dir)
                break
            except Unavailable:
                if wait is None:
                    raise
                await asyncio.sleep(wait)
    (data_dir / "joined").write_text("yes")


async def main(plan_path: Path) -> None:
    plan = json.loads(plan_path.read_text())
    sem = asyncio.Semaphore(8)
    await asyncio.gather(*(_join(n, sem) for n in plan["nodes"]))
    beat = float(plan["heartbeat_s"])
    agents = [
        Agent(AgentOptions(data_dir=Path(n["data_dir"]), fake_hw="hgx-h100-8", heartbeat_interval_s=beat))
        for n in plan["nodes"]
    ]
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    tasks = [asyncio.create_task(a.run(), name=f"agent-{i}") for i, a in enumerate(agents)]
    await stop.wait()
    for a in agents:
        a.stopped.set()
    await asyncio.gather(*tasks, return_exceptions=True)


if __name__ == "__main__":
    logs.setup("node")
    asyncio.run(main(Path(sys.argv[1])))
