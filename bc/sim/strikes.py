"""Strikes: faults aimed at the moments an invariant is about, not at random times. Pure: a draw in, a fault out.

Faults drawn on a clock rarely land where a bug hides. At 50 nodes, heavy chaos, for 30 minutes, a few
agent restarts fall between a command's acceptance and its ACK, and a few nodes go away while they hold
GPUs: a broken journal or a liveness that releases on disconnect is caught by luck. So, as FoundationDB's
BUGGIFY does at the dangerous points of its code, the simulator also strikes at those moments. Each time an
agent's journal accepts a command, and each time a command's side effect starts, `Strikes.at` draws from
the run's own Random whether to strike there, and how:

=========================== ================ ==============================================================
strike                       heavy chance     what happens (its invariant)
=========================== ================ ==============================================================
duplicate-after-accept       0.15 an accept   the command's frame reaches the node again 0.5-15 s later (a
                                              late duplicate, while it runs or after it ended): the journal
                                              must re-attach it or resend its result, not run it again (I2)
cut-at-accept                0.10 an accept   the node's connections reset as its journal accepts the
                                              command: the ACK does not leave on that stream; the next
                                              session's Hello must tell the gateway it runs (I2)
crash-at-accept              0.05 an accept   the agent dies right after the acceptance (its connections
                                              reset first, so nothing more leaves) and systemd restarts it
                                              after 5 s: the gateway replays the command (I2)
crash-while-running          0.05 a start     the agent dies as the side effect starts and restarts after 5 s:
                             (0.3 once-only)  the replay must be re-attached or settled by the journal, never
                                              run again when its kind must not run twice (I2)
power-loss-while-running     0.10 a start     the machine loses power as the side effect starts: it comes
                             (0.6 once-only)  back after 30-120 s on a new boot id with what its journal had
                                              made durable (I2: a non-retry-safe command must not start
                                              again; I5: the node is away with its holds)
gateway-kill-at-accept       0.05 an accept   with several gateways: the gateway process holding the node's
                                              session dies right after the acceptance and a new one starts
                                              after 10-30 s (I2, and every node it held re-homes)
=========================== ================ ==============================================================

"Once-only" is a kind that must not start twice (not retry-safe and not self-terminating: `gpu.reset`):
where a journal that forgets, or was never durable, shows, so struck far more often as it starts.

Light strikes at a tenth of those chances, storm as heavy, none never. A node is struck at most once at a
time (not again until it is back), nothing is struck in the quiet period, and a gateway kill needs another
gateway up.
Each strike is a fault like the schedule's: a `sim.fault` event (kind above, subject the node or the
gateway, with the command id) and a count under `faults`, so a run's report, its trace and its digest
carry them, and the same seed strikes the same moments.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass

from bc.sim.chaos import RESTART_S, Level

CUT_AT_ACCEPT = "cut-at-accept"
DUPLICATE_AFTER_ACCEPT = "duplicate-after-accept"
CRASH_AT_ACCEPT = "crash-at-accept"
CRASH_WHILE_RUNNING = "crash-while-running"
POWER_LOSS_WHILE_RUNNING = "power-loss-while-running"
GATEWAY_KILL_AT_ACCEPT = "gateway-kill-at-accept"
STRIKE_KINDS = (
    DUPLICATE_AFTER_ACCEPT,
    CUT_AT_ACCEPT,
    CRASH_AT_ACCEPT,
    CRASH_WHILE_RUNNING,
    POWER_LOSS_WHILE_RUNNING,
    GATEWAY_KILL_AT_ACCEPT,
)

ACCEPT = "accept"
START = "start"

_HEAVY: Mapping[str, Mapping[str, float]] = {
    ACCEPT: {DUPLICATE_AFTER_ACCEPT: 0.15, CUT_AT_ACCEPT: 0.10, CRASH_AT_ACCEPT: 0.05, GATEWAY_KILL_AT_ACCEPT: 0.05},
    START: {CRASH_WHILE_RUNNING: 0.05, POWER_LOSS_WHILE_RUNNING: 0.10},
}
_ONCE_ONLY_START: Mapping[str, float] = {CRASH_WHILE_RUNNING: 0.3, POWER_LOSS_WHILE_RUNNING: 0.6}
"""A command whose kind must not start twice (not retry-safe, not self-terminating: `gpu.reset`) is where a
journal that forgets, or that was never durable, shows: struck far more often as it starts."""
_SCALE: Mapping[Level, float] = {"none": 0.0, "light": 0.1, "heavy": 1.0, "storm": 1.0}


@dataclass(frozen=True)
class Strike:
    """One strike: `kind` on `node_id` at the moment `command_id` was accepted or started."""

    kind: str
    node_id: str
    command_id: str
    params: Mapping[str, float]


class Strikes:
    """Whether to strike at each moment the run reports, drawn from its own Random in the order they come."""

    def __init__(self, level: Level, rng: random.Random, gateways: int = 1) -> None:
        self.scale = _SCALE[level]
        self.rng = rng
        self.gateways = gateways

    def at(self, moment: str, node_id: str, command_id: str, once_only: bool = False) -> Strike | None:
        """The strike for this moment (`ACCEPT` or `START` of `command_id` on `node_id`; `once_only`: its kind
        must not start twice), or None. One draw per moment whatever the outcome, so the draws stay in step
        with the moments."""
        if self.scale == 0:
            return None
        roll = self.rng.random()
        chances = _ONCE_ONLY_START if moment == START and once_only else _HEAVY[moment]
        for kind, chance in chances.items():
            if kind == GATEWAY_KILL_AT_ACCEPT and self.gateways < 2:
                continue
            p = chance * self.scale
            if roll < p:
                return Strike(kind, node_id, command_id, self._params(kind))
            roll -= p
        return None

    def _params(self, kind: str) -> dict[str, float]:
        if kind == POWER_LOSS_WHILE_RUNNING:
            return {"down_s": round(self.rng.uniform(30, 120), 3)}
        if kind == GATEWAY_KILL_AT_ACCEPT:
            return {"down_s": round(self.rng.uniform(10, 30), 3)}
        if kind == DUPLICATE_AFTER_ACCEPT:
            return {"after_s": round(self.rng.uniform(0.5, 15), 3)}
        if kind in (CRASH_AT_ACCEPT, CRASH_WHILE_RUNNING):
            return {"restart_s": RESTART_S}
        return {}


__all__ = [
    "ACCEPT",
    "CRASH_AT_ACCEPT",
    "CRASH_WHILE_RUNNING",
    "CUT_AT_ACCEPT",
    "DUPLICATE_AFTER_ACCEPT",
    "GATEWAY_KILL_AT_ACCEPT",
    "POWER_LOSS_WHILE_RUNNING",
    "START",
    "STRIKE_KINDS",
    "Strike",
    "Strikes",
]
