"""H1, the health reconciler's invariant, over what a `bc sim --health` run recorded (`bc.sim.health_facts`).
Pure, in the style of `bc.sim.checkers`: None when it holds, else a frozen counterexample whose `sentence` names
the nodes, GPUs, episodes, reservations or commands behind it and the simulated time.

    H1  within the limits: at no instant more nodes in remediation (an episode started and not ended) than
        the policy's node cap (`max_nodes`, `max_fleet_percent` of the fleet, never below one), nor two nodes
        of one `per_label` value, and no rolling hour with more than `max_actions_per_hour` automatic actions
        (starts and escalations);
        no hold released by the reconciler: a hold on a GPU with an episode open is released only when the
        operator asked (a window's end, a node's failure and liveness are I5's);
        no `gpu.reset` of a remediation on a GPU while a hold on it is live (started on the node, whether the
        node then refused it or not: the node's own check is its defence, not the control plane's);
        each condition acted on once: an episode starts at most once and escalates at most once, one GPU
        never has two episodes open at once (a flap or a repeat joins the open one, or opens after it), and
        an episode that opens on a GPU within the policy's `repeat_window_s` of the start of its last
        remediation (one that ended) is quarantined as it opens: a second failure is never queued to be
        remediated again.

`check_h1` returns the first violation in simulated time.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from bc.control.capacity.placement_plan import iso
from bc.sim.health_facts import EpisodeRun, GpuHold, HealthFacts, HealthLimits, HealthReset, HoldReleased

HOUR_MS = 3_600_000


@dataclass(frozen=True)
class OverNodeCap:
    at_ms: int
    node_ids: tuple[str, ...]
    cap: int
    limits: HealthLimits

    @property
    def sentence(self) -> str:
        return (
            f"H1: {len(self.node_ids)} nodes in remediation at once at {iso(self.at_ms)} "
            f"({', '.join(self.node_ids)}), over the cap of {self.cap} (max_nodes {self.limits.max_nodes}, "
            f"{self.limits.max_fleet_percent} % of {self.limits.fleet_size} nodes)"
        )


@dataclass(frozen=True)
class SameLabel:
    at_ms: int
    node_id: str
    other: str
    label: str
    value: str

    @property
    def sentence(self) -> str:
        return (
            f"H1: {self.node_id} and {self.other}, both {self.label}={self.value}, in remediation at once at "
            f"{iso(self.at_ms)} (per_label allows one)"
        )


@dataclass(frozen=True)
class OverHourly:
    at_ms: int
    actions: int
    cap: int
    node_id: str
    episode_id: str

    @property
    def sentence(self) -> str:
        return (
            f"H1: {self.actions} automatic actions in the hour to {iso(self.at_ms)}, the last on {self.node_id} "
            f"(episode {self.episode_id}), over max_actions_per_hour {self.cap}"
        )


@dataclass(frozen=True)
class ReleasedByReconciler:
    release: HoldReleased
    episode: EpisodeRun

    @property
    def sentence(self) -> str:
        r, e = self.release, self.episode
        return (
            f"H1: {r.reservation_id}'s hold on GPU {e.gpu} of {r.node_id} was released at {iso(r.t_ms)} while "
            f"episode {e.episode_id} was open on it, and no operator had asked"
        )

    @property
    def at_ms(self) -> int:
        return self.release.t_ms


@dataclass(frozen=True)
class ResetUnderHold:
    reset: HealthReset
    hold: GpuHold

    @property
    def sentence(self) -> str:
        r, h = self.reset, self.hold
        what = "reset" if r.done else "was sent to reset (the node refused it: it sees the hold too)"
        return (
            f"H1: gpu.reset {r.command_id} (episode {r.episode_id}) {what} GPU {r.gpu} of {r.node_id} at "
            f"{iso(r.t_ms)} under {h.reservation_id}'s live hold (held since {iso(h.start_ms)})"
        )

    @property
    def at_ms(self) -> int:
        return self.reset.t_ms


@dataclass(frozen=True)
class ActedTwice:
    episode: EpisodeRun
    at_ms: int
    why: str

    @property
    def sentence(self) -> str:
        e = self.episode
        return f"H1: episode {e.episode_id} of GPU {e.gpu} on {e.node_id} {self.why} at {iso(self.at_ms)}"

    @property
    def node_id(self) -> str:
        return self.episode.node_id


Violation = OverNodeCap | SameLabel | OverHourly | ReleasedByReconciler | ResetUnderHold | ActedTwice


def check_h1(h: HealthFacts) -> Violation | None:
    found: list[Violation] = []
    if h.limits is not None:
        found += _limits(h, h.limits)
    found += _releases(h.releases, h.episodes)
    found += _resets(h.resets, h.holds)
    found += _once(h.episodes)
    if h.limits is not None:
        found += _repeats(h.episodes, h.limits.repeat_window_s * 1000)
    return min(found, key=lambda f: f.at_ms, default=None)


def _limits(h: HealthFacts, lim: HealthLimits) -> list[Violation]:
    out: list[Violation] = []
    runs = sorted((e for e in h.episodes if e.running is not None), key=lambda e: (e.starts[0], e.episode_id))
    for e in runs:  # the count only grows at a start
        t = e.starts[0]
        nodes = sorted({r.node_id for r in runs if r.running_at(t)})
        if len(nodes) > lim.node_cap:
            out.append(OverNodeCap(t, tuple(nodes), lim.node_cap, lim))
            break
    if lim.per_label:
        for e in runs:
            t = e.starts[0]
            value = h.labels.get(e.node_id, {}).get(lim.per_label)
            other = next(
                (
                    r.node_id
                    for r in runs
                    if value is not None
                    and r.node_id != e.node_id
                    and r.running_at(t)
                    and h.labels.get(r.node_id, {}).get(lim.per_label) == value
                ),
                None,
            )
            if other is not None and value is not None:
                out.append(SameLabel(t, e.node_id, other, lim.per_label, value))
                break
    actions = sorted((t, e.node_id, e.episode_id) for e in h.episodes for t in (*e.starts, *e.escalations))
    for i, (t, node_id, eid) in enumerate(actions):
        n = sum(1 for a, _, _ in actions[: i + 1] if a > t - HOUR_MS)
        if n > lim.max_actions_per_hour:
            out.append(OverHourly(t, n, lim.max_actions_per_hour, node_id, eid))
            break
    return out


def _releases(releases: Sequence[HoldReleased], episodes: Sequence[EpisodeRun]) -> list[Violation]:
    for r in releases:
        if r.by_operator:
            continue
        for e in episodes:
            q, end = e.open_span()
            if e.node_id == r.node_id and e.gpu in r.gpus and q <= r.t_ms and (end is None or r.t_ms <= end):
                return [ReleasedByReconciler(r, e)]
    return []


def _resets(resets: Sequence[HealthReset], holds: Sequence[GpuHold]) -> list[Violation]:
    by_gpu: dict[tuple[str, str], list[GpuHold]] = {}
    for hold in holds:
        by_gpu.setdefault((hold.node_id, hold.gpu), []).append(hold)
    for r in resets:
        live = next((x for x in by_gpu.get((r.node_id, r.gpu), ()) if x.live_at(r.t_ms)), None)
        if live is not None:
            return [ResetUnderHold(r, live)]
    return []


def _once(episodes: Sequence[EpisodeRun]) -> list[Violation]:
    out: list[Violation] = []
    for e in episodes:
        if len(e.starts) > 1:
            out.append(ActedTwice(e, e.starts[1], f"started {len(e.starts)} remediations"))
        if len(e.escalations) > 1:
            out.append(ActedTwice(e, e.escalations[1], f"escalated {len(e.escalations)} times"))
    per_gpu: dict[tuple[str, str], list[EpisodeRun]] = {}
    for e in episodes:
        per_gpu.setdefault((e.node_id, e.gpu), []).append(e)
    for mine in per_gpu.values():
        for a, b in itertools.pairwise(sorted(mine, key=lambda e: (e.queued_ms, e.episode_id))):
            if a.ended_ms is None or b.queued_ms < a.ended_ms:
                out.append(ActedTwice(b, b.queued_ms, f"opened while episode {a.episode_id} was still open"))
    return out


def _repeats(episodes: Sequence[EpisodeRun], window_ms: int) -> list[Violation]:
    """An episode that opened within the window of an earlier remediation's start on its GPU (one that ended
    before it opened; overlapping ones are `_once`'s) and was not quarantined as it opened (queued for another
    remediation instead)."""
    per_gpu: dict[tuple[str, str], list[EpisodeRun]] = {}
    for e in episodes:
        per_gpu.setdefault(e.key, []).append(e)
    out: list[Violation] = []
    for mine in per_gpu.values():
        ordered = sorted(mine, key=lambda e: (e.queued_ms, e.episode_id))
        for i, b in enumerate(ordered):
            if b.outcome == "quarantined" and b.ended_ms == b.queued_ms:
                continue
            last = max(
                (a for a in ordered[:i] if a.starts and a.ended_ms is not None and a.ended_ms <= b.queued_ms),
                key=lambda a: a.starts[0],
                default=None,
            )
            if last is not None and b.queued_ms - last.starts[0] < window_ms:
                why = f"was queued to be remediated again within the repeat window of episode {last.episode_id}'s start"
                out.append(ActedTwice(b, b.queued_ms, why))
    return out


__all__ = [
    "ActedTwice",
    "OverHourly",
    "OverNodeCap",
    "ReleasedByReconciler",
    "ResetUnderHold",
    "SameLabel",
    "check_h1",
]
