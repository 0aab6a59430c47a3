"""The health reconciler's decision: conditions, episodes and limits in; what to do out. Pure.

Theory of operation
-------------------
An **episode** is one GPU's (or one node's: a host unit's condition, `gpu` "") stretch of being sick,
from the condition the policy acts on to the GPU returned, quarantined or cleared. There is at most one
open episode per GPU (`(node, gpu)` is its key),
so a condition that flaps, or is reported again by every status, joins the episode already open: one
remediation job per episode, never one per flap. Its states, one table (`TRANSITIONS`):

    queued ──start──▶ running ──finish──▶ done          (the GPU is returned to placement)
       │                 │  └─escalate─▶ running       (stage reset → reboot: the reset failed)
       │                 └──quarantine─▶ quarantined   (the remediation failed: kept out, for a person)
       ├──quarantine───▶ quarantined                   (the policy says so, or a second failure in the window)
       └──clear────────▶ cleared                       (the condition was gone for `flap_window_s`)

`decide(world)` reads no clock and draws nothing: the same world gives the same decisions, in the order
the loop carries them out. In one call:

1. a running episode whose job ended: `Finish` (the reset ran and the GPU read healthy, or the reboot was
   done), `Escalate` to a node reboot (the reset failed and the policy says reboot: an automatic action,
   so it waits for the hourly limit like any other), or `Quarantine` (anything else: a rejected batch, a
   drain past its deadline, a failed reboot);
2. a queued episode whose condition is gone is marked (`Seen`), and `Clear`ed once it stayed gone for
   the flap window; one whose condition is back is unmarked;
3. a sick GPU with no open episode whose first matching rule acts `Open`s one: quarantined at once when
   the rule says so or when the GPU's last remediation started within `repeat_window_s`;
4. queued episodes, oldest first, `Start` while the limits allow: the node is connected, a
   `reset-when-idle` GPU has no live hold, fewer than `max_actions_per_hour` actions in the last hour,
   and a node not yet in remediation fits `Limits.fleet_cap` and the `per_label` rule; the others `Wait`
   with the reason (`bc health` shows it).

A **node episode** (`gpu` ""; a host unit's condition such as `DriverMismatch` `RebootRequired`, whose
rule says `reboot`) starts at stage `reboot` with the node's `reboot` job (its drain waits for every hold
on the node and never releases one), under the same limits; it finishes when the job is done and is
quarantined when it is not. Nothing is cordoned for it (the job's drain keeps new holds off the node while
it runs), so what keeps a failed one from rebooting the node again is step 3: a node condition does not
open again within `repeat_window_s` of an episode of it that ended quarantined.

So, under any sequence of conditions and outcomes, the nodes in remediation never exceed the cap, two
nodes of one `per_label` value are never in remediation together, and no rolling hour holds more than
`max_actions_per_hour` starts and escalations (tests/unit/health/test_health_decide.py checks it with
Hypothesis). Nothing here releases a hold: the job's drain waits for the GPU's holds (docs/health.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from bc.control.health.conditions import GpuCondition
from bc.control.health.policy import QUARANTINE, REBOOT, RESET_WHEN_IDLE, Policy
from bc.errors import ProtocolError

HOUR_MS = 3_600_000

QUEUED, RUNNING, DONE, QUARANTINED, CLEARED = "queued", "running", "done", "quarantined", "cleared"
STATES: tuple[str, ...] = (QUEUED, RUNNING, DONE, QUARANTINED, CLEARED)
OPEN: frozenset[str] = frozenset({QUEUED, RUNNING})
TERMINAL: frozenset[str] = frozenset({DONE, QUARANTINED, CLEARED})
RESET_STAGE, REBOOT_STAGE = "reset", "reboot"

TRANSITIONS: Mapping[tuple[str, str], str] = {
    (QUEUED, "start"): RUNNING,
    (QUEUED, "quarantine"): QUARANTINED,
    (QUEUED, "clear"): CLEARED,
    (RUNNING, "escalate"): RUNNING,
    (RUNNING, "finish"): DONE,
    (RUNNING, "quarantine"): QUARANTINED,
}
"""The only way an episode moves; anything else is a bug (`next_state` raises)."""


def first_stage(action: str) -> str:
    """The stage an episode starts at: a node's reboot, or a GPU's reset."""
    return REBOOT_STAGE if action == REBOOT else RESET_STAGE


def next_state(state: str, event: str) -> str:
    try:
        return TRANSITIONS[(state, event)]
    except KeyError:
        raise ProtocolError(f"health episode: can't {event} in state {state}") from None


Key = tuple[str, str]


@dataclass(frozen=True)
class JobOutcome:
    """The episode's current job (`bc.jobs`), as the loop read it."""

    state: str  # the DAG's roll-up: queued | running | done | failed | cancelled
    terminal: bool
    reset_failed: bool = False  # the gpu.reset step failed, or it ran and the GPU did not read healthy
    error: str = ""


@dataclass(frozen=True)
class Episode:
    node_id: str
    gpu: str
    state: str
    action: str
    match: str = ""
    stage: str = ""  # running: reset | reboot
    opened_ms: int = 0
    started_ms: int = 0  # 0: never started
    ended_ms: int = 0
    clear_since_ms: int = 0  # queued: its condition has been gone since (0: present)
    job: JobOutcome | None = None

    @property
    def key(self) -> Key:
        return (self.node_id, self.gpu)


@dataclass(frozen=True)
class NodeFacts:
    connected: bool = True
    labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class World:
    now_ms: int
    policy: Policy
    conditions: Sequence[GpuCondition]
    episodes: Sequence[Episode]
    """The open episodes (queued, running), one per GPU at most."""
    recent: Sequence[Episode] = ()
    """Episodes that ended within the repeat window: the last start of a GPU, a node's last quarantine."""
    nodes: Mapping[str, NodeFacts] = field(default_factory=dict)
    """The fleet: every live node of role node."""
    busy: frozenset[Key] = frozenset()
    """GPUs with a live hold (an unreleased booking whose window is not over)."""
    quarantined: frozenset[Key] = frozenset()
    """GPUs kept out for a person: no new episode opens on them."""
    actions: Sequence[int] = ()
    """When each automatic action (a start, an escalation) happened, newest last."""


# -- decisions, in the order the loop carries them out ---------------------------------------------


@dataclass(frozen=True)
class Finish:
    key: Key
    why: str


@dataclass(frozen=True)
class Escalate:
    key: Key
    why: str


@dataclass(frozen=True)
class Quarantine:
    key: Key
    why: str


@dataclass(frozen=True)
class Seen:
    """A queued episode's condition is gone since `since_ms` (0: it is back)."""

    key: Key
    since_ms: int


@dataclass(frozen=True)
class Clear:
    key: Key
    why: str


@dataclass(frozen=True)
class Open:
    condition: GpuCondition
    action: str
    match: str
    quarantine_why: str = ""  # non-empty: it opens quarantined at once

    @property
    def key(self) -> Key:
        return self.condition.key


@dataclass(frozen=True)
class Start:
    key: Key
    action: str
    evidence: Mapping[str, Any]


@dataclass(frozen=True)
class Wait:
    key: Key
    why: str


Decision = Finish | Escalate | Quarantine | Seen | Clear | Open | Start | Wait


@dataclass(frozen=True)
class LimitsUsed:
    """What `bc health` shows of the limits at a world: nodes in remediation and actions this hour."""

    nodes: int
    node_cap: int
    actions_last_hour: int
    actions_cap: int


def limits_used(world: World) -> LimitsUsed:
    lim = world.policy.limits
    return LimitsUsed(
        nodes=len({e.node_id for e in world.episodes if e.state == RUNNING}),
        node_cap=lim.fleet_cap(len(world.nodes)),
        actions_last_hour=_actions_in_hour(world),
        actions_cap=lim.max_actions_per_hour,
    )


def _actions_in_hour(world: World) -> int:
    return sum(1 for t in world.actions if t > world.now_ms - HOUR_MS)


def decide(world: World) -> list[Decision]:
    p = world.policy
    out: list[Decision] = []
    sick: dict[Key, GpuCondition] = {}  # one per key: a node's conditions share it; the first that acts counts
    for c in sorted(world.conditions, key=lambda c: (c.since_ms, c.key)):
        if c.key not in sick or (p.action_for(sick[c.key].signals)[0] == "none" != p.action_for(c.signals)[0]):
            sick[c.key] = c
    budget = p.limits.max_actions_per_hour - _actions_in_hour(world)
    ended: set[Key] = set()

    # 1. running episodes whose job ended
    for e in sorted((e for e in world.episodes if e.state == RUNNING), key=lambda e: (e.started_ms, e.key)):
        j = e.job
        if j is None or not j.terminal:
            continue
        if e.stage == REBOOT_STAGE:
            if j.state == "done":
                out.append(Finish(e.key, "the node rebooted"))
            else:
                what = "the reboot" if e.gpu == "" else "the reboot after a failed reset"
                out.append(Quarantine(e.key, f"{what} ended {j.state}: {j.error or 'no reason'}"))
            ended.add(e.key)
        elif j.state == "done" and not j.reset_failed:
            out.append(Finish(e.key, "the GPU was reset and reads healthy"))
            ended.add(e.key)
        elif j.reset_failed and p.on_reset_failure == "reboot":
            if budget > 0:
                out.append(Escalate(e.key, f"the reset failed ({j.error or 'the GPU does not read healthy'}): reboot"))
                budget -= 1
            else:
                out.append(Wait(e.key, _hourly(p.limits.max_actions_per_hour) + " (the reboot after a failed reset)"))
        else:
            what = "the reset failed" if j.reset_failed else f"the remediation ended {j.state}"
            out.append(Quarantine(e.key, f"{what}: {j.error or 'no reason given'}"))
            ended.add(e.key)

    # 2. queued episodes whose condition went (or came back)
    queued = [e for e in world.episodes if e.state == QUEUED]
    for e in queued:
        if e.key in sick:
            if e.clear_since_ms:
                out.append(Seen(e.key, 0))
        elif not e.clear_since_ms:
            out.append(Seen(e.key, world.now_ms))
        elif world.now_ms - e.clear_since_ms >= p.flap_window_s * 1000:
            out.append(Clear(e.key, f"the condition was gone for {p.flap_window_s} s"))
            ended.add(e.key)

    # 3. sick GPUs with no open episode
    open_keys = {e.key for e in world.episodes}
    started_last = {r.key: r.started_ms for r in sorted(world.recent, key=lambda r: r.started_ms) if r.started_ms}
    window_ms = p.repeat_window_s * 1000
    node_held = {  # a node condition whose last episode failed: left to a person for the repeat window
        r.key for r in world.recent if r.gpu == "" and r.state == QUARANTINED and world.now_ms - r.ended_ms < window_ms
    }
    waiting: list[tuple[int, Key, str]] = [
        (e.opened_ms, e.key, e.action) for e in queued if e.key not in ended and e.key in sick
    ]
    for c in sorted(sick.values(), key=lambda c: (c.since_ms, c.key)):
        if c.key in open_keys or c.key in world.quarantined or c.key in node_held or c.node_id not in world.nodes:
            continue
        action, match = p.action_for(c.signals)
        if action == "none":
            continue
        why = ""
        last = started_last.get(c.key)
        if action == QUARANTINE:
            why = f"the policy quarantines {match}"
        elif last is not None and world.now_ms - last < window_ms:
            what = "node" if c.gpu == "" else "GPU"
            why = f"a second failure of this {what} within {p.repeat_window_s} s of its last remediation"
        out.append(Open(c, action, match, why))
        open_keys.add(c.key)
        if not why:
            waiting.append((world.now_ms, c.key, action))

    # 4. start queued episodes, oldest first, within the limits
    if not p.enabled:
        out.extend(Wait(k, "the health policy is disabled") for _, k, _ in sorted(waiting))
        return out
    running_nodes = {e.node_id for e in world.episodes if e.state == RUNNING and e.key not in ended}
    cap = p.limits.fleet_cap(len(world.nodes))
    label = p.limits.per_label
    for _, key, action in sorted(waiting):
        node = world.nodes.get(key[0])
        if node is None or not node.connected:
            out.append(Wait(key, f"node {key[0]} is not connected"))
            continue
        if action == RESET_WHEN_IDLE and key in world.busy:
            out.append(Wait(key, "the reset waits for the next idle window: a hold is live on the GPU"))
            continue
        if budget <= 0:
            out.append(Wait(key, _hourly(p.limits.max_actions_per_hour)))
            continue
        if key[0] not in running_nodes:
            if len(running_nodes) >= cap:
                out.append(Wait(key, f"{len(running_nodes)} of at most {cap} node(s) are in remediation"))
                continue
            value = node.labels.get(label) if label else None
            other = next(
                (n for n in sorted(running_nodes) if value is not None and world.nodes[n].labels.get(label) == value),
                None,
            )
            if other is not None:
                out.append(Wait(key, f"node {other} of {label}={value} is in remediation"))
                continue
        out.append(Start(key, action, sick[key].evidence()))
        running_nodes.add(key[0])
        budget -= 1
    return out


def _hourly(cap: int) -> str:
    return f"the hourly limit: {cap} automatic action(s) in the last hour"
