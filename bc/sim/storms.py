"""XID storms for `bc sim --health`: bursts of GPU faults across the fleet, drawn up front. Pure: a Random in,
a list of `bc.sim.chaos.Fault`s out.

Off by default (`SimConfig.health`): the catch table and the sweeps of issue 32 were measured without it, and
every existing seed keeps its digest. With it, `bc.sim.fleet` sets `POLICY` at the start (the health
reconciler acts on nothing until a policy is set) and draws these faults from the run's chaos Random **after**
every draw `bc.sim.chaos.schedule` made, as the gateway faults and the spec replays are, so the rest of a
seed's schedule is unchanged.

A **storm** strikes many nodes within `SPREAD_S` seconds: `STORM_SHARE` of the fleet (at least
`MIN_STORM_NODES`), one or two GPUs each (the fake `hgx-h100-8` has 8). The first storm comes 60-120 s into
the run, the others `STORMS_PER_HOUR` an hour (Poisson). Each GPU struck gets one of:

=========== ====== ===========================================================================================
kind        share  what the fake hardware then reads (`agent.hw.fake_faults`: the node's `fake-faults` file)
=========== ====== ===========================================================================================
gpu-xid     0.50   one critical XID (79, 74, 95 or 48), an event the agent keeps until a reset reads healthy
gpu-ecc     0.25   an uncorrectable ECC error held for `duration_s` (60-600 s): a reset inside it does not
                   read healthy, so it fails and the policy reboots the node (a failed reset)
gpu-flap    0.25   the ECC error on for `on_s`, off for `off_s`, `cycles` times (3-6; 5-40 s each): a
                   condition that flaps, which must make one job, not one per flap
=========== ====== ===========================================================================================

and, with `REPEAT_CHANCE`, the same GPU an XID again 120-900 s later: a second failure within the policy's
24 h repeat window, which must quarantine it rather than remediate it again. Whether a struck GPU is under a
live hold is the workload's doing (most GPUs are held at some point); `bc.sim.coverage` counts how often.
Every fault ends by `duration_s`, so the quiet period starts healed.

**Aimed XIDs** (`aimed`, drawn after the storms): whether a storm's GPU is held, or was remediated before, is
the workload's doing, and at 50 nodes a storm met a held GPU 6 times a run and a GPU after its episode 5 times,
too few for the breaks that show only there. So `AIMED_PER_HOUR` XIDs an hour (Poisson) of each aim are drawn
with a node and a GPU, and moved at their time (`bc.sim.storm_aim`) to where their aim says, when there is such
a GPU: `held` to a GPU a booking holds now (where a reconciler that releases holds or resets under them shows),
`again` to a GPU whose last episode ended done or cleared (a repeat within the 24 h window, where one that
forgets its episodes remediates again). With none, it strikes where it was drawn.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Sequence

from bc.sim.chaos import WARMUP_S, Fault

GPU_XID = "gpu-xid"
GPU_ECC = "gpu-ecc"
GPU_FLAP = "gpu-flap"
KINDS: tuple[str, ...] = (GPU_XID, GPU_ECC, GPU_FLAP)

STORMS_PER_HOUR = 4.0
STORM_SHARE = (0.08, 0.25)
MIN_STORM_NODES = 3
SPREAD_S = 20.0
GPUS_PER_NODE = 8
XIDS = (79, 74, 95, 48)
REPEAT_CHANCE = 0.35
XID_LINE_S = 6.0
"""How long an XID's line stays in the faults file: three of the agent's 2 s health passes read it."""

AIM_HELD = "held"
AIM_AGAIN = "again"
AIMS: tuple[str, ...] = (AIM_HELD, AIM_AGAIN)
AIMED_PER_HOUR = 36.0
AIM_FROM_S = {AIM_HELD: 60.0, AIM_AGAIN: 240.0}
"""When each aim's XIDs begin (seconds after the warm-up): a repeat needs an episode that ended first."""

LIMITS = {"max_nodes": 3, "max_fleet_percent": 10, "per_label": "", "max_actions_per_hour": 24}
POLICY = json.dumps(
    {
        "drain": "wait",
        "drain_deadline_s": 600,
        "on_reset_failure": "reboot",
        "repeat_window_s": 86400,
        "flap_window_s": 120,
        "limits": LIMITS,
    },
    sort_keys=True,
)
"""The policy `bc sim --health` sets at the start: the default rules, limits a storm exceeds (3 nodes, 10 % of
the fleet, 24 actions an hour), a drain that waits at most 10 minutes (then the GPU is quarantined) and a
2-minute flap window, so a 30-minute run sees remediations end every way."""


def schedule(rng: random.Random, node_ids: Sequence[str], duration_s: float) -> list[Fault]:
    """The storms of a run (see the module docstring), sorted as `bc.sim.chaos.schedule` sorts."""
    span = duration_s - WARMUP_S
    nodes = sorted(node_ids)
    if span <= 120 or not nodes:
        return []
    starts = [rng.uniform(60, 120)]
    t = starts[0]
    while True:
        t += rng.expovariate(STORMS_PER_HOUR / 3600)
        if t >= span * 0.9:
            break
        starts.append(t)
    out: list[Fault] = []
    for offset in starts:
        size = min(len(nodes), max(MIN_STORM_NODES, round(len(nodes) * rng.uniform(*STORM_SHARE))))
        for node in sorted(rng.sample(nodes, size)):
            for gpu in sorted(rng.sample(range(GPUS_PER_NODE), rng.choice((1, 1, 2)))):
                at = offset + rng.uniform(0, SPREAD_S)
                out.append(_hit(rng, node, gpu, at, duration_s))
                if rng.random() < REPEAT_CHANCE:
                    again = at + rng.uniform(120, 900)
                    if WARMUP_S + again < duration_s - XID_LINE_S:
                        out.append(_xid(rng, node, gpu, again))
    return sorted(out, key=lambda f: (f.t_s, f.kind, f.targets))


def aimed(rng: random.Random, node_ids: Sequence[str], duration_s: float) -> list[Fault]:
    """The aimed XIDs of a run (see the module docstring): each a `gpu-xid` with its `aim` among its params and
    the node and GPU it strikes if nothing fits its aim, sorted as `schedule` sorts."""
    span = duration_s - WARMUP_S
    nodes = sorted(node_ids)
    if span <= 120 or not nodes:
        return []
    out: list[Fault] = []
    for aim in AIMS:
        t = AIM_FROM_S[aim]
        while True:
            t += rng.expovariate(AIMED_PER_HOUR / 3600)
            if t >= span * 0.9:
                break
            f = _xid(rng, rng.choice(nodes), rng.randrange(GPUS_PER_NODE), t)
            out.append(Fault(f.t_s, f.kind, f.targets, {**f.params, "aim": aim}))
    return sorted(out, key=lambda f: (f.t_s, f.kind, f.targets))


def _xid(rng: random.Random, node: str, gpu: int, offset: float) -> Fault:
    return Fault(round(WARMUP_S + offset, 3), GPU_XID, (node,), {"gpu": gpu, "xid": rng.choice(XIDS)})


def _hit(rng: random.Random, node: str, gpu: int, offset: float, duration_s: float) -> Fault:
    kind = rng.choices(KINDS, weights=(2, 1, 1))[0]
    t = round(WARMUP_S + offset, 3)
    left = max(1.0, duration_s - t)
    if kind == GPU_XID:
        return _xid(rng, node, gpu, offset)
    if kind == GPU_ECC:
        return Fault(t, kind, (node,), {"gpu": gpu, "duration_s": _floor(min(rng.uniform(60, 600), left))})
    cycles = rng.randint(3, 6)
    on_s, off_s = _floor(rng.uniform(5, 40)), _floor(rng.uniform(5, 40))
    cycles = max(1, min(cycles, int(left // (on_s + off_s))))
    return Fault(t, kind, (node,), {"gpu": gpu, "on_s": on_s, "off_s": off_s, "cycles": cycles})


def _floor(x: float) -> float:
    return math.floor(x * 1000) / 1000


__all__ = ["AIMS", "AIM_AGAIN", "AIM_HELD", "KINDS", "LIMITS", "POLICY", "aimed", "schedule"]
