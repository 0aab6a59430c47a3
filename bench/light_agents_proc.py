"""The simulator's light agents (`bench.light_agents`) in a process of their own, for `bench.rehome --agent-procs`.

    python -m bench.light_agents_proc ROOT FIRST END [START_RATE]

Runs the agents of the joined nodes `ROOT/r{FIRST:05d}` … `ROOT/r{END-1:05d}` on this process's one event
loop. A benchmark with thousands of agents in its own process measures that process's one core as much as
the gateways (a 1,000-node re-home showed it at 100 % while the gateways idled a third of the time);
several of these share the agents out. With START_RATE the agents start that many a second (a rolling
start) instead of all at once.

It talks to its parent on stdin and stdout, one line each: it prints `ready N` once all N agents are
connected (welcomed); `status EVERY FOR` on stdin has each agent offer a new status every EVERY seconds
for FOR seconds (`bench.light_agents.offer_status`) and prints `offered N` when done; `stop` on stdin (or
the end of stdin) stops the agents and ends the process.

The file-descriptor limit is raised (`raise_fd_limit`): each agent holds a socket, and a dial in flight
another.
"""

from __future__ import annotations

import asyncio
import logging
import os
import resource
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

from agent.app import Agent
from bench.light_agents import light_agent, offer_status

LineHandler = Callable[[str, list[Agent]], Awaitable[str | None]]
"""Another command on stdin (`bench.fleet_gen`'s): the line to print back, or None for a line it does not take."""


async def run(root: Path, first: int, end: int, start_rate: float = 0.0, on_line: LineHandler | None = None) -> None:
    agents: list[Agent] = [light_agent(root / f"r{i:05d}", i) for i in range(first, end)]
    tasks: list[asyncio.Task[None]] = []
    starting = asyncio.create_task(start_agents(agents, tasks, start_rate))
    loop = asyncio.get_running_loop()
    stdin = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdin), sys.stdin)

    async def announce() -> None:
        await asyncio.gather(*(a.connected.wait() for a in agents))
        print(f"ready {len(agents)}", flush=True)

    announcer = asyncio.create_task(announce())
    while True:
        line = (await stdin.readline()).decode().strip()
        if line in ("stop", ""):
            break
        if line.startswith("status "):
            _, every, for_s = line.split()
            offered = await offer_status(agents, float(every), float(for_s))
            print(f"offered {offered}", flush=True)
        elif on_line is not None:
            answer = await on_line(line, agents)
            if answer is not None:
                print(answer, flush=True)
    announcer.cancel()
    starting.cancel()
    for a in agents:
        a.stopped.set()
    await asyncio.gather(*tasks, return_exceptions=True)


async def start_agents(agents: list[Agent], tasks: list[asyncio.Task[None]], rate: float) -> None:
    """Each agent's `run()` as a task: all at once (`rate` 0), or `rate` a second, a rolling start."""
    t0 = time.monotonic()
    for k, a in enumerate(agents):
        tasks.append(asyncio.create_task(a.run()))
        if rate > 0:
            await asyncio.sleep(max(0.0, t0 + (k + 1) / rate - time.monotonic()))


FD_LIMIT = 65536


def raise_fd_limit() -> None:
    """To `FD_LIMIT` where the process may raise its hard limit (root), else to the hard limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(hard, FD_LIMIT), max(hard, FD_LIMIT)))
    except (ValueError, OSError):
        if soft < hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def main() -> None:
    raise_fd_limit()
    root, first, end = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    start_rate = float(sys.argv[4]) if len(sys.argv) > 4 else 0.0
    logging.basicConfig(level=logging.ERROR)  # the storm being measured is routine for these agents
    asyncio.run(run(root, first, end, start_rate))


if __name__ == "__main__":
    main()
