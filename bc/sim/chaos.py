"""The chaos schedule: which faults a simulated run injects, and when. Pure: a seed in, a list out.

`schedule(level, rng, node_ids, duration_s, gateways)` draws every fault of a run up front, so the whole
run's misfortune is a function of its seed and can be printed, counted and replayed before anything
runs. `bc.sim.fleet` executes the list (each fault also becomes a `sim.fault` event in the events log).

Rates (Poisson; "per node-hour" faults pick one node each, so a fleet's count scales with its size):

=================== ===================== ================= ==================================================
kind                 heavy                  light             what it does (params)
=================== ===================== ================= ==================================================
agent-crash          0.20 / node-hour       0.02              the agent process dies; systemd restarts it after
                                                              `restart_s` = 5 s (RestartSec=5)
node-reboot          0.08 / node-hour       0.008             the machine goes away for `down_s` (30-120 s) and
                                                              comes back with a new boot id
journal-loss         0.25 / node-hour       0.025             the agent dies and restarts after 5 s on a fresh
                                                              journal (new journal id)
partition            0.03 / node-hour,      0.003             1-5 % of the nodes (at least one) lose the link for
                     a group each                             `duration_s` (20-300 s), `direction` both (60 %),
                                                              to-node or from-node
half-open            0.30 / node-hour       0.03              one node's link goes half-open (frames to the node
                                                              are lost, the node does not notice) for 20-180 s
reset                0.15 / node-hour       0.015             one node's session is reset (closed under it)
stall                0.10 / node-hour       0.01              one node's link holds every frame for 1-30 s
node-clock-skew      0.05 / node-hour       0.005             one node's wall clock steps by `offset_s`
                                                              (±1-120 s; its monotonic clock does not move)
spec-replay          1.00 / node-hour       0.1               a desired state older than the spec a node
                                                              applies reaches it again on its live session
                                                              (a stale session's or zombie gateway's send);
                                                              the target, or the next node in order that has
                                                              such a spec and a welcomed session; drawn last
cp-clock-skew        2 / hour               0.2               the control plane's clock steps by `offset_s`, kept
                                                              within ±0.9 s of the store's (the design's 1 s)
cp-restart           once, mid-run           once (≥ 10 min)  the control plane stops, stays down `down_s`
                                                              (5-30 s), starts again
gateway-kill         2 / hour (gateways>1)  0.2               one gateway process dies (its connections reset,
                                                              its lease left to expire) and a new process
                                                              starts at its address after `down_s` (10-120 s)
gateway-stall        2 / hour (gateways>1)  0.2               one gateway process freezes for `duration_s`
                                                              (25-60 s: past its 20 s lease), then wakes
store-outage         1 / hour (gateways>1)  0.1               every transaction of every process fails for
                                                              `duration_s` (5-45 s)
=================== ===================== ================= ==================================================

`storm` is heavy with the gateway kinds far more often: gateway kills and stalls 4 an hour each and store
outages 10 an hour (the store-outage chaos at its heaviest); it needs `gateways` > 1.

The gateway kinds and the store outage are drawn only with `gateways` > 1, after every other draw but the
replays, so a one-gateway run's schedule is what it always was. The spec replays are drawn last of all (their
own arrivals and heavy's one guaranteed), so with them every other fault of a seed's schedule is the one it
had before they existed (the runs differ all the same: the replays happen). A gateway kill or stall targets
`gw-<i>`, never one already down or frozen, and never the last one up: at least one gateway routes at
every moment. Heavy's guarantee covers them too when there are several gateways.

At 100 nodes for an hour heavy expects about 75 node faults plus the control plane's, on the order of a
hundred (seed 1 draws 86), and about a hundred spec replays (88 more), besides what heavy links do
on their own (`bc.seams.network.LinkFaults.heavy`:
dead connections, resets, duplicates, reordering, stalls). Heavy also guarantees every kind at least
once in a run long enough to hold it (a kind the draws missed gets one fault at a drawn time), so a
heavy run always exercises every path; light makes no such promise. Faults fall in
`[WARMUP_S, duration_s)` and every fault with a duration ends by `duration_s`: the quiet period after
a run starts healed.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

Level = Literal["none", "light", "heavy", "storm"]
LEVELS: tuple[Level, ...] = ("none", "light", "heavy", "storm")
STORM = "storm"
"""Heavy, with the store out and gateways killed and stalled far more often: the store-outage chaos at its
heaviest. Only with several gateways (the outage needs the store they share)."""

AGENT_CRASH = "agent-crash"
NODE_REBOOT = "node-reboot"
JOURNAL_LOSS = "journal-loss"
PARTITION = "partition"
HALF_OPEN = "half-open"
RESET = "reset"
STALL = "stall"
NODE_CLOCK_SKEW = "node-clock-skew"
SPEC_REPLAY = "spec-replay"
CP_CLOCK_SKEW = "cp-clock-skew"
CP_RESTART = "cp-restart"
GATEWAY_KILL = "gateway-kill"
GATEWAY_STALL = "gateway-stall"
STORE_OUTAGE = "store-outage"

KINDS: tuple[str, ...] = (
    AGENT_CRASH,
    NODE_REBOOT,
    JOURNAL_LOSS,
    PARTITION,
    HALF_OPEN,
    RESET,
    STALL,
    NODE_CLOCK_SKEW,
    SPEC_REPLAY,
    CP_CLOCK_SKEW,
    CP_RESTART,
)
"""The kinds of a one-gateway run."""
GATEWAY_KINDS: tuple[str, ...] = (GATEWAY_KILL, GATEWAY_STALL, STORE_OUTAGE)
"""The kinds only a run with several gateways draws."""
STORE = "store"
"""The target of a store outage (and the subject of its event)."""


def kinds_for(gateways: int) -> tuple[str, ...]:
    """Every kind a run with this many gateways can draw (and heavy draws each at least once)."""
    return KINDS + GATEWAY_KINDS if gateways > 1 else KINDS


RESTART_S = 5.0
"""systemd's RestartSec=5: how long a crashed agent stays down."""
CP_SKEW_MAX_S = 0.9
"""The control plane's clock stays within this of the store's: `ClockSkew` is raised past 1 s."""
WARMUP_S = 30.0
"""No fault before every node had a chance to join."""

# Per node-hour (node faults) and per hour (control-plane faults), at heavy; light is a tenth.
_HEAVY_NODE_RATES: Mapping[str, float] = {
    AGENT_CRASH: 0.20,
    NODE_REBOOT: 0.08,
    JOURNAL_LOSS: 0.25,
    PARTITION: 0.03,
    HALF_OPEN: 0.30,
    RESET: 0.15,
    STALL: 0.10,
    NODE_CLOCK_SKEW: 0.05,
}
_HEAVY_REPLAY_RATE = 1.0  # spec-replay, per node-hour: drawn last (see the module docstring)
_HEAVY_CP_RATES: Mapping[str, float] = {CP_CLOCK_SKEW: 2.0}
_HEAVY_GATEWAY_RATES: Mapping[str, float] = {GATEWAY_KILL: 2.0, GATEWAY_STALL: 2.0, STORE_OUTAGE: 1.0}
_STORM_GATEWAY_RATES: Mapping[str, float] = {GATEWAY_KILL: 4.0, GATEWAY_STALL: 4.0, STORE_OUTAGE: 10.0}
_SCALE: Mapping[Level, float] = {"none": 0.0, "light": 0.1, "heavy": 1.0, "storm": 1.0}


def strong(level: Level) -> bool:
    """Heavy or storm: every kind at least once, the heavy links."""
    return level in ("heavy", STORM)


@dataclass(frozen=True)
class Fault:
    """One fault: at `t_s` seconds into the run, `kind` strikes `targets` (node ids; empty: the control plane)."""

    t_s: float
    kind: str
    targets: tuple[str, ...] = ()
    params: Mapping[str, float | str] = field(default_factory=dict)

    def describe(self) -> str:
        who = ",".join(self.targets) if len(self.targets) <= 3 else f"{len(self.targets)} nodes"
        args = " ".join(f"{k}={v}" for k, v in sorted(self.params.items()))
        return f"{self.t_s:9.1f}s {self.kind} {who or 'control-plane'} {args}".rstrip()


def schedule(
    level: Level, rng: random.Random, node_ids: Sequence[str], duration_s: float, gateways: int = 1
) -> list[Fault]:
    """Every fault of a run, sorted by time (then kind, then targets); see the module docstring."""
    if level not in _SCALE:
        raise ValueError(f"chaos level {level!r}: one of {', '.join(LEVELS)}")
    if gateways < 1:
        raise ValueError(f"a run needs at least one gateway, not {gateways}")
    scale = _SCALE[level]
    span = duration_s - WARMUP_S
    if level == STORM and gateways < 2:
        raise ValueError("the storm chaos takes the shared store out: it needs at least two gateways")
    if scale == 0 or span <= 0 or not node_ids:
        return []
    nodes = sorted(node_ids)
    hours = span / 3600
    out: list[Fault] = []
    for kind, rate in _HEAVY_NODE_RATES.items():
        for t in _arrivals(rng, rate * scale * len(nodes) * hours, span):
            out.append(_node_fault(kind, t, rng, nodes, duration_s))
    for kind, rate in _HEAVY_CP_RATES.items():
        for t in _arrivals(rng, rate * scale * hours, span):
            out.append(_cp_fault(kind, t, rng))
    if duration_s >= (600 if level == "light" else 120):
        out.append(_cp_fault(CP_RESTART, rng.uniform(0.4, 0.6) * duration_s - WARMUP_S, rng))
    if strong(level):
        seen = {f.kind for f in out}
        for kind in KINDS:
            if kind not in seen and kind not in (CP_RESTART, SPEC_REPLAY):
                t = rng.uniform(0, span * 0.8)
                missing = _cp_fault(kind, t, rng) if kind in _HEAVY_CP_RATES else None
                out.append(missing or _node_fault(kind, t, rng, nodes, duration_s))
    if gateways > 1:
        out += _gateway_faults(level, rng, gateways, duration_s)
    out += _replays(level, rng, nodes, duration_s)
    return sorted(out, key=lambda f: (f.t_s, f.kind, f.targets))


def _replays(level: Level, rng: random.Random, nodes: Sequence[str], duration_s: float) -> list[Fault]:
    """The spec replays, drawn after every other fault (see the module docstring); heavy draws at least one."""
    span = duration_s - WARMUP_S
    offsets = _arrivals(rng, _HEAVY_REPLAY_RATE * _SCALE[level] * len(nodes) * span / 3600, span)
    if strong(level) and not offsets:
        offsets = [rng.uniform(0, span * 0.8)]
    return [_node_fault(SPEC_REPLAY, t, rng, nodes, duration_s) for t in offsets]


def _gateway_faults(level: Level, rng: random.Random, gateways: int, duration_s: float) -> list[Fault]:
    """The gateway kills and stalls and the store outages (drawn after everything else; see the docstring)."""
    span = duration_s - WARMUP_S
    hours = span / 3600
    drawn: list[tuple[float, str]] = []
    rates = _STORM_GATEWAY_RATES if level == STORM else _HEAVY_GATEWAY_RATES
    for kind, rate in rates.items():
        drawn += [(t, kind) for t in _arrivals(rng, rate * _SCALE[level] * hours, span)]
    if strong(level):
        for kind in GATEWAY_KINDS:
            if kind not in {k for _, k in drawn}:
                drawn.append((rng.uniform(0, span * 0.8), kind))
    out: list[Fault] = []
    busy: list[tuple[float, float, int]] = []  # (from, to, gateway) of the kills and stalls placed
    for offset, kind in sorted(drawn):
        t = round(WARMUP_S + offset, 3)
        left = max(1.0, duration_s - t)  # a fault with a duration ends by the end of the run
        lo, hi = (5.0, 45.0) if kind == STORE_OUTAGE else (10.0, 120.0) if kind == GATEWAY_KILL else (25.0, 60.0)
        length = math.floor(min(rng.uniform(lo, hi), left) * 1000) / 1000
        if kind == STORE_OUTAGE:
            out.append(Fault(t, kind, (STORE,), {"duration_s": length}))
            continue
        down = {g for a, b, g in busy if a <= t + length and b >= t}
        free = [g for g in range(gateways) if g not in down]
        target = rng.choice(free) if free else 0  # drawn even when unused: the draws stay in step
        if len(free) < 2:
            continue  # it would take the last gateway up down: skipped
        busy.append((t, t + length, target))
        param = "down_s" if kind == GATEWAY_KILL else "duration_s"
        out.append(Fault(t, kind, (f"gw-{target}",), {param: length}))
    return out


def _arrivals(rng: random.Random, expected: float, span: float) -> list[float]:
    """A Poisson process's arrival offsets in [0, span), `expected` of them on average."""
    out: list[float] = []
    if expected <= 0:
        return out
    t = rng.expovariate(expected / span)
    while t < span:
        out.append(t)
        t += rng.expovariate(expected / span)
    return out


def _node_fault(kind: str, offset: float, rng: random.Random, nodes: Sequence[str], duration_s: float) -> Fault:
    t = round(WARMUP_S + offset, 3)
    left = max(1.0, duration_s - t)  # a fault with a duration ends by the end of the run

    def lasting(lo: float, hi: float) -> float:
        return math.floor(min(rng.uniform(lo, hi), left) * 1000) / 1000

    if kind == PARTITION:
        size = max(1, round(len(nodes) * rng.uniform(0.01, 0.05)))
        group = tuple(sorted(rng.sample(list(nodes), min(size, len(nodes)))))
        direction = rng.choices(("both", "to_node", "from_node"), weights=(6, 2, 2))[0]
        return Fault(t, kind, group, {"duration_s": lasting(20, 300), "direction": direction})
    node = (rng.choice(list(nodes)),)
    if kind in (AGENT_CRASH, JOURNAL_LOSS):
        return Fault(t, kind, node, {"restart_s": RESTART_S})
    if kind == NODE_REBOOT:
        return Fault(t, kind, node, {"down_s": lasting(30, 120)})
    if kind == STALL:
        return Fault(t, kind, node, {"duration_s": lasting(1, 30)})
    if kind in (HALF_OPEN, RESET, SPEC_REPLAY):
        return Fault(t, kind, node)
    if kind == NODE_CLOCK_SKEW:
        return Fault(t, kind, node, {"offset_s": round(rng.choice((-1, 1)) * rng.uniform(1, 120), 3)})
    raise ValueError(f"not a node fault: {kind}")


def _cp_fault(kind: str, offset: float, rng: random.Random) -> Fault:
    t = round(WARMUP_S + offset, 3)
    if kind == CP_CLOCK_SKEW:
        # An absolute offset from the store's clock, not a step: steps must not add up past the tolerance.
        return Fault(t, kind, (), {"offset_s": round(rng.uniform(-CP_SKEW_MAX_S, CP_SKEW_MAX_S), 3)})
    if kind == CP_RESTART:
        return Fault(t, kind, (), {"down_s": round(rng.uniform(5, 30), 3)})
    raise ValueError(f"not a control-plane fault: {kind}")
