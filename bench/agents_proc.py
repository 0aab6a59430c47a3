"""Many production agents in a process of their own, for a benchmark that measures the system, not the client.

    python -m bench.agents_proc DATA_DIR [DATA_DIR ...]

Each data dir is a joined node's (`bc join` or `agent.join.join_node`). Each node runs the agent
`bc node --fake-hw hgx-h100-8` runs (`agent.app.production_parts`: its own fsynced SQLite journal, gRPC with
mutual TLS to the gateways it joined with, the health monitor, renewal), all on this process's one event
loop, logging at INFO as `bc node` does (to stderr, which the caller sends to a file). One thing is added:
the dial is wrapped to count the session's frames, by message type and direction, so a benchmark can say how
many messages a command costs on the wire.

It talks to its parent on stdin and stdout, one line each:

* it prints `ready N` once all N agents are connected (welcomed);
* `stats` on stdin → one JSON line: `{"sent": {type: n}, "received": {type: n}, "sent_bytes": …,
  "received_bytes": …, "connected": n}` (cumulative since the start);
* `stop` (or the end of stdin) → the agents stop and the process exits.

With `BC_AGENTS_PROFILE=FILE` in its environment, the process runs cProfile (the loop's thread only) from
the first `stats` to the second, which `bench.throughput` sends around its measured window, timed by the
thread's CPU clock, and writes the stats to FILE (`pstats`): call counts per command, which the machine's load
does not distort.
"""

from __future__ import annotations

import asyncio
import cProfile
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path

os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

from agent.app import Agent, AgentOptions, production_parts
from agent.session.dialing import Dial
from bc.protocol import closing
from bc.protocol.pb.session_pb2 import CloseReason, GatewayMessage, NodeMessage
from bc.runtime import logs
from bc.seams.link import Link

PROFILE = "hgx-h100-8"


class Counts:
    def __init__(self) -> None:
        self.sent: Counter[str] = Counter()
        self.received: Counter[str] = Counter()
        self.sent_bytes = 0
        self.received_bytes = 0

    def doc(self, agents: list[Agent]) -> dict[str, object]:
        return {
            "sent": dict(self.sent),
            "received": dict(self.received),
            "sent_bytes": self.sent_bytes,
            "received_bytes": self.received_bytes,
            "connected": sum(1 for a in agents if a.connected.is_set()),
        }


class CountingLink:
    """The production link, each frame counted by its `oneof` (node → gateway `sent`, gateway → node `received`)."""

    def __init__(self, inner: Link[GatewayMessage, NodeMessage], counts: Counts) -> None:
        self.inner, self.counts = inner, counts

    async def send(self, msg: NodeMessage) -> None:
        await self.inner.send(msg)
        self.counts.sent[msg.WhichOneof("msg") or "?"] += 1
        self.counts.sent_bytes += msg.ByteSize()

    async def recv(self) -> GatewayMessage | None:
        msg = await self.inner.recv()
        if msg is not None:
            self.counts.received[msg.WhichOneof("msg") or "?"] += 1
            self.counts.received_bytes += msg.ByteSize()
        return msg

    async def close(
        self, code: str, details: str, reason: CloseReason = closing.UNSPECIFIED, *, retry_after_ms: int | None = None
    ) -> None:
        await self.inner.close(code, details, reason, retry_after_ms=retry_after_ms)


def counting(dial: Dial, counts: Counts) -> Dial:
    async def go() -> Link[GatewayMessage, NodeMessage]:
        return CountingLink(await dial(), counts)

    return go


async def main(dirs: list[Path]) -> None:
    counts = Counts()
    agents = []
    for d in dirs:
        opts = AgentOptions(data_dir=d, fake_hw=PROFILE)
        parts = production_parts(opts)
        parts.dial = counting(parts.dial, counts)
        agents.append(Agent(opts, parts))
    tasks = [asyncio.create_task(a.run()) for a in agents]
    profile_to = os.environ.get("BC_AGENTS_PROFILE", "")
    # The loop thread's CPU clock, not the wall's: a statement that waits for the GIL or the disk costs no CPU.
    profiler = cProfile.Profile(time.thread_time) if profile_to else None
    stats_asked = 0
    try:
        while sum(1 for a in agents if a.connected.is_set()) < len(agents):
            if any(t.done() for t in tasks):
                raise SystemExit(f"an agent stopped before connecting: {next(t for t in tasks if t.done())!r}")
            await asyncio.sleep(0.1)
        print(f"ready {len(agents)}", flush=True)
        while True:
            line = (await asyncio.to_thread(sys.stdin.readline)).strip()
            if line == "stats":
                doc = json.dumps(counts.doc(agents))
                stats_asked += 1
                if profiler is not None and stats_asked == 1:
                    profiler.enable()
                elif profiler is not None and stats_asked == 2:
                    profiler.disable()
                    profiler.dump_stats(profile_to)
                print(doc, flush=True)
            elif line in ("stop", ""):
                break
    finally:
        for a in agents:
            a.stopped.set()
        await asyncio.gather(*tasks, return_exceptions=True)


if __name__ == "__main__":
    logs.setup("node")
    asyncio.run(main([Path(p) for p in sys.argv[1:]]))
