"""The simulator's workload over the production control plane, gateway and agents (SessionPair's wiring).

What an operator would read in the summary: every part of the mix happened (reservations with and
without windows, spec writes, each command kind the fake hardware runs, signed batches that ran, the
three job templates), refusals are counted and never crash the workload, and one seed draws the same
mix twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

from agent.kinds import REGISTRY
from bc.session_pair import ControlPlane, PairConfig, SessionPair
from bc.sim.workload import Rates, make_workload
from bc.store import quorum as q_sql

BUSY = Rates(reservations=4.0, releases=2.0, specs=2.0, commands=8.0, batches_per_hour=12.0, jobs_per_hour=12.0)


class PairFleet:
    """The few things the workload needs of `bc.sim.fleet.Fleet`, over a SessionPair."""

    def __init__(self, pair: SessionPair) -> None:
        self.pair = pair
        self.work: Counter[str] = Counter()

    @property
    def node_ids(self) -> Sequence[str]:
        return self.pair.node_ids()

    @contextlib.asynccontextmanager
    async def control(self) -> AsyncIterator[ControlPlane]:
        while self.pair.cp is None:
            await asyncio.sleep(1)
        yield self.pair.cp


async def run_workload(root: Path, seed: int, minutes: float) -> tuple[Counter[str], SessionPair, list[str]]:
    pair = SessionPair(root, seed=seed, agents=6, cfg=PairConfig(jobs=True, reboot_s=20.0))
    await pair.start()
    fleet = PairFleet(pair)
    task = asyncio.create_task(make_workload(random.Random(seed), BUSY)(fleet))
    try:
        await asyncio.sleep(minutes * 60)
        assert not task.done(), task  # the workload never ends on its own, whatever was refused
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    await asyncio.sleep(120)  # let what is in flight settle
    async with pair.store.transaction(write=False) as tx:
        batches = [str(r["state"]) for r in await q_sql.list_batches(tx, limit=1000)]
    return fleet.work, pair, batches


async def test_the_mix_reaches_every_part_of_the_fleet(tmp_path: Path) -> None:
    work, pair, batches = await run_workload(tmp_path, seed=3, minutes=60)
    try:
        events = await pair.events()
    finally:
        await pair.stop()
    assert work["reservations"] > 0 and work["releases"] > 0, work
    assert work["reservations.window"] > 0 and work["reservations.duration"] > 0, work
    assert work["spec.devices"] > 0, work
    for section in ("access", "host", "telemetry"):
        assert work[f"spec.{section}"] > 0, work
    for kind in sorted(REGISTRY):
        assert work[f"command.{kind}"] > 0, (kind, work)
    assert work["batches"] > 0 and work["approvals"] > 0, work
    for template in ("reboot", "remediate", "rollout"):
        assert work[f"jobs.{template}"] > 0, (template, work)
    # The approvers' signatures count: batches are approved, and destructive commands ran on the nodes.
    assert "approved" in batches, batches
    settled = Counter(
        (json.loads(data).get("kind"), json.loads(data).get("state"))
        for _, type_, _, data, _ in events
        if type_ == "command.settled"
    )
    assert settled[("gpu.reset", "succeeded")] > 0, settled
    assert pair.reboots, "no node.reboot ran"
    types = Counter(type_ for _, type_, _, _, _ in events)
    assert types["quorum.changed"] == 4, types  # three approvers and the allowance (k is 2 already)
    assert types["batch.rejected"] == work["rejections"], types  # each rejection fails its batch


async def test_one_seed_draws_the_same_mix(tmp_path: Path) -> None:
    first, pair, _ = await run_workload(tmp_path / "a", seed=5, minutes=20)
    await pair.stop()
    second, pair, _ = await run_workload(tmp_path / "b", seed=5, minutes=20)
    await pair.stop()
    assert first == second
    assert sum(first.values()) > 20, first
