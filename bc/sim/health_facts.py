"""What a `bc sim --health` run records for H1 (`bc.sim.health_checker`): the health reconciler's episodes, the
limits in force, its GPU resets, the holds on GPUs and their releases. Plain frozen facts, times in the store's
milliseconds, read from the store at the end (`bc.sim.health_record`)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass(frozen=True)
class HealthLimits:
    """The policy's limits in force from `since_ms` (the run sets one policy, at its start), and the fleet's size
    (every live node of role node, as the reconciler counts it)."""

    max_nodes: int
    max_fleet_percent: int
    per_label: str
    max_actions_per_hour: int
    fleet_size: int
    since_ms: int = 0
    repeat_window_s: int = 86400
    """The policy's `repeat_window_s`: a GPU sick again within it of its last remediation's start is quarantined,
    not remediated again."""

    @property
    def node_cap(self) -> int:
        """As `bc.control.health.policy.Limits.fleet_cap`: the smaller of the two, never below one node."""
        return min(self.max_nodes, max(1, self.fleet_size * self.max_fleet_percent // 100))


@dataclass(frozen=True)
class EpisodeRun:
    """One episode as its events tell it: queued, started (`health.remediation.started`, each time one was
    written), escalated to a reboot, ended (done, failed, cleared or quarantined; None: open at the end)."""

    episode_id: str
    node_id: str
    gpu: str
    queued_ms: int
    starts: tuple[int, ...] = ()
    escalations: tuple[int, ...] = ()
    ended_ms: int | None = None
    outcome: str = ""  # done | failed | cleared | quarantined | "" (open)
    dag_ids: tuple[str, ...] = ()

    @property
    def running(self) -> tuple[int, int | None] | None:
        """[start, end) of the stretch the node was in remediation for it; None: never started."""
        return (self.starts[0], self.ended_ms) if self.starts else None

    def running_at(self, t_ms: int) -> bool:
        r = self.running
        return r is not None and r[0] <= t_ms and (r[1] is None or t_ms < r[1])

    @property
    def key(self) -> tuple[str, str]:
        return (self.node_id, self.gpu)

    def open_span(self) -> tuple[int, int | None]:
        return (self.queued_ms, self.ended_ms)


@dataclass(frozen=True)
class HealthReset:
    """A `gpu.reset` of a health remediation's job for `gpu` started on `node_id` at `t_ms`; `done`: its result
    says it reset the GPU (False: the node refused, or the reset failed)."""

    t_ms: int
    node_id: str
    gpu: str
    command_id: str
    episode_id: str
    done: bool = True


@dataclass(frozen=True)
class GpuHold:
    """A reservation held `gpu` on `node_id` from `start_ms` until the control plane decided to end it (a release,
    an end event) or its window ended (`end_ms`; None: still held at the end)."""

    reservation_id: str
    node_id: str
    gpu: str
    start_ms: int
    end_ms: int | None

    def live_at(self, t_ms: int) -> bool:
        return self.start_ms <= t_ms and (self.end_ms is None or t_ms < self.end_ms)


@dataclass(frozen=True)
class HoldReleased:
    """The control plane decided to release a reservation's hold at `t_ms` (`reservation.releasing`, or
    `reservation.released` with none before it); `by_operator`: the workload had asked for it by then."""

    t_ms: int
    reservation_id: str
    node_id: str
    gpus: tuple[str, ...]
    by_operator: bool


@dataclass(frozen=True)
class EpisodeWait:
    """A queued episode waited (`health.remediation.waiting`) for `why`."""

    t_ms: int
    episode_id: str
    why: str

    @property
    def on_a_limit(self) -> bool:
        """The node cap, the per-label rule or the hourly limit made it wait (not a disconnected node)."""
        return "in remediation" in self.why or "hourly limit" in self.why


@dataclass
class HealthFacts:
    limits: HealthLimits | None = None
    labels: dict[str, dict[str, str]] = field(default_factory=dict)
    episodes: list[EpisodeRun] = field(default_factory=list)
    resets: list[HealthReset] = field(default_factory=list)
    holds: list[GpuHold] = field(default_factory=list)
    releases: list[HoldReleased] = field(default_factory=list)
    waits: list[EpisodeWait] = field(default_factory=list)
    injected: Counter[str] = field(default_factory=Counter)
    """The storms' faults the run injected, by kind (`bc.sim.storms.KINDS`)."""


__all__ = ["EpisodeRun", "EpisodeWait", "GpuHold", "HealthFacts", "HealthLimits", "HealthReset", "HoldReleased"]
