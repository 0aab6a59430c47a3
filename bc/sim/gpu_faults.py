"""The XID storms' injector (`bc sim --health`): GPU faults written to each node's fake-faults file.

The fake hardware's health source (`agent.hw.fake_faults.FakeHealthSource`) reads `<node dir>/fake-faults`
on each of the agent's health passes (every 2 s), as `bc node --fake-hw` does: a line `xid79:3` is one XID
event when it appears, `ecc:3` an uncorrectable ECC error while it is listed. This module keeps the lines
each node's faults hold (a count each, so two faults of one GPU overlap safely) and writes the file whenever
they change. The file is read inline on the simulation's loop, so a run replays.
"""

from __future__ import annotations

import asyncio
from collections import Counter

from agent.hw.fake_faults import FAULTS_FILE
from bc.sim.chaos import Fault
from bc.sim.pair import SessionPair
from bc.sim.storms import GPU_ECC, GPU_FLAP, GPU_XID, XID_LINE_S


class GpuFaults:
    def __init__(self, pair: SessionPair) -> None:
        self.pair = pair
        self.lines: dict[str, Counter[str]] = {}

    async def inject(self, f: Fault) -> None:
        node, p = f.targets[0], f.params
        gpu = p["gpu"]  # an index, or (an aimed XID's, `bc.sim.storm_aim`) a uuid: the fake reads both
        if f.kind == GPU_XID:
            await self.hold(node, f"xid{int(p['xid'])}:{gpu}", XID_LINE_S)
        elif f.kind == GPU_ECC:
            await self.hold(node, f"ecc:{gpu}", float(p["duration_s"]))
        elif f.kind == GPU_FLAP:
            for _ in range(int(p["cycles"])):
                await self.hold(node, f"ecc:{gpu}", float(p["on_s"]))
                await asyncio.sleep(float(p["off_s"]))
        else:
            raise ValueError(f"not a GPU fault: {f.kind}")

    async def hold(self, node_id: str, line: str, seconds: float) -> None:
        """`line` in the node's faults file for `seconds`."""
        lines = self.lines.setdefault(node_id, Counter())
        lines[line] += 1
        self._write(node_id)
        try:
            await asyncio.sleep(seconds)
        finally:
            lines[line] -= 1
            self._write(node_id)

    def _write(self, node_id: str) -> None:
        text = "".join(f"{line}\n" for line, n in sorted(self.lines[node_id].items()) if n > 0)
        (self.pair.nodes[node_id].dir / FAULTS_FILE).write_text(text, "utf-8")
