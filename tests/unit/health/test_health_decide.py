"""The health reconciler's decision (`bc.control.health.decide`): examples, and a Hypothesis model check.

The model keeps its own episodes and applies each decision through the one state table
(`decide.next_state`), so a decision out of order raises. Under any sequence of conditions appearing,
flapping and going, jobs ending, holds coming and going, nodes leaving and time passing, it checks:
the nodes in remediation never exceed the cap (N and M % of the fleet), two nodes of one `per_label`
value are never in remediation together, no rolling hour holds more than R automatic actions, one
episode per GPU at a time and one job per episode (a flap joins the open episode), a queued episode
clears only after its condition stayed gone for the flap window, and a `reset-when-idle` GPU never
starts while a hold is live on it. Node conditions (a driver that needs a reboot, the other host units)
are in the same sequences: a node episode gets at most one job (its reboot), counts against the same
limits, and does not open again within the repeat window of one that failed.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bc.control.health import decide as d
from bc.control.health.conditions import GpuCondition, node_conditions, signals_of
from bc.control.health.policy import Limits, Policy
from bc.errors import ProtocolError

SIGNALS = [
    ("Xid79", "XID 79: GPU has fallen off the bus"),
    ("Xid74", "XID 74: NVLink error"),
    ("EccUncorrectable", "3 uncorrectable volatile ECC errors"),
    ("RowRemapPending", "a row remap is pending until the GPU is reset"),
    ("RowRemapFailed", "a row remap failed"),
    ("Throttled", "throttled: hw-slowdown"),
]


NODE_SIGNALS = [
    ("DriverMismatch", "True", "RebootRequired", "driver 550.127.05 is installed; 535.183.01 is loaded"),
    ("DriverMismatch", "True", "InstallFailed", "apt-get failed"),
    ("FabricManagerReady", "False", "NotRunning", "nvidia-fabricmanager is inactive"),
    ("KubernetesJoined", "False", "JoinFailed", "kubeadm join: exit 1"),
]


def cond(node: str, gpu: str, i: int = 0, since: int = 0) -> GpuCondition:
    if gpu == "":
        return node_cond(node, i, since)
    reason, message = SIGNALS[i]
    return GpuCondition(node, gpu, reason, message, since, signals_of(reason, message))


def node_cond(node: str, i: int = 0, since: int = 0) -> GpuCondition:
    ctype, status, reason, message = NODE_SIGNALS[i % len(NODE_SIGNALS)]
    conds = [{"type": ctype, "status": status, "reason": reason, "message": message, "since_ms": since}]
    (c,) = node_conditions(node, conds)
    return c


# -- examples ------------------------------------------------------------------------------------


def test_an_xid_opens_one_episode_and_starts_it() -> None:
    w = d.World(0, Policy(), [cond("n1", "G0")], [], nodes={"n1": d.NodeFacts()})
    out = d.decide(w)
    assert [type(x).__name__ for x in out] == ["Open", "Start"]
    assert out[1] == d.Start(("n1", "G0"), "reset", cond("n1", "G0").evidence())


def test_a_throttled_gpu_has_no_rule_and_opens_nothing() -> None:
    w = d.World(0, Policy(), [cond("n1", "G0", 5)], [], nodes={"n1": d.NodeFacts()})
    assert d.decide(w) == []


def test_a_second_failure_within_the_window_is_quarantined() -> None:
    recent = [d.Episode("n1", "G0", d.DONE, "reset", started_ms=1000, ended_ms=2000)]
    w = d.World(3_600_000, Policy(), [cond("n1", "G0")], [], recent=recent, nodes={"n1": d.NodeFacts()})
    (opened,) = d.decide(w)
    assert isinstance(opened, d.Open) and "second failure" in opened.quarantine_why


def test_beyond_the_node_limit_a_condition_waits_with_the_reason() -> None:
    running = d.Episode("n1", "G0", d.RUNNING, "reset", stage="reset", started_ms=1)
    w = d.World(
        10, Policy(), [cond("n1", "G0"), cond("n2", "G0")], [running], nodes={"n1": d.NodeFacts(), "n2": d.NodeFacts()}
    )
    out = d.decide(w)
    assert out[-1] == d.Wait(("n2", "G0"), "1 of at most 1 node(s) are in remediation")


def test_a_failed_reset_escalates_to_a_reboot_then_a_failed_reboot_quarantines() -> None:
    job = d.JobOutcome("failed", True, reset_failed=True, error="gpu.reset on n1 failed")
    e = d.Episode("n1", "G0", d.RUNNING, "reset", stage="reset", started_ms=1, job=job)
    w = d.World(10, Policy(), [cond("n1", "G0")], [e], nodes={"n1": d.NodeFacts()})
    assert isinstance(d.decide(w)[0], d.Escalate)
    e2 = replace(e, stage="reboot", job=d.JobOutcome("failed", True, error="drain deadline"))
    assert isinstance(d.decide(replace(w, episodes=[e2]))[0], d.Quarantine)


def test_a_rejected_batch_quarantines_rather_than_retrying() -> None:
    job = d.JobOutcome("failed", True, error="batch b-1 was rejected")
    e = d.Episode("n1", "G0", d.RUNNING, "reset", stage="reset", started_ms=1, job=job)
    (q,) = d.decide(d.World(10, Policy(), [cond("n1", "G0")], [e], nodes={"n1": d.NodeFacts()}))
    assert q == d.Quarantine(("n1", "G0"), "the remediation ended failed: batch b-1 was rejected")


def test_a_driver_that_needs_a_reboot_starts_the_nodes_reboot_and_the_other_host_units_are_only_shown() -> None:
    conds = [node_cond("n1", i) for i in range(len(NODE_SIGNALS))]
    assert [dict(c.signals) for c in conds] == [
        {"driver-reboot": 1},
        {"driver": 1},
        {"fabric-manager": 1},
        {"kubernetes": 1},
    ]
    w = d.World(0, Policy(), conds, [], nodes={"n1": d.NodeFacts()})
    out = d.decide(w)
    assert [type(x).__name__ for x in out] == ["Open", "Start"]
    assert out[1] == d.Start(("n1", ""), "reboot", conds[0].evidence())
    assert d.first_stage("reboot") == "reboot" and conds[0].evidence()["type"] == "DriverMismatch"


def test_a_node_reboot_that_failed_is_left_to_a_person_for_the_repeat_window() -> None:
    failed = d.Episode("n1", "", d.QUARANTINED, "reboot", started_ms=1, ended_ms=1000)
    w = d.World(2000, Policy(), [node_cond("n1")], [], recent=[failed], nodes={"n1": d.NodeFacts()})
    assert d.decide(w) == []
    later = replace(w, now_ms=1000 + 86_400_000)
    assert [type(x).__name__ for x in d.decide(later)] == ["Open", "Start"]


def test_a_node_reboot_waits_for_the_node_limit_like_a_reset() -> None:
    running = d.Episode("n2", "G0", d.RUNNING, "reset", stage="reset", started_ms=1)
    w = d.World(
        10, Policy(), [cond("n2", "G0"), node_cond("n1")], [running], nodes={"n1": d.NodeFacts(), "n2": d.NodeFacts()}
    )
    assert d.decide(w)[-1] == d.Wait(("n1", ""), "1 of at most 1 node(s) are in remediation")


def test_transitions_outside_the_table_raise() -> None:
    assert d.next_state(d.QUEUED, "start") == d.RUNNING
    with pytest.raises(ProtocolError, match=r"^health episode: can't start in state done$"):
        d.next_state(d.DONE, "start")


# -- the model ------------------------------------------------------------------------------------


@dataclass
class Model:
    policy: Policy
    nodes: dict[str, d.NodeFacts]
    now: int = 0
    sick: dict[d.Key, GpuCondition] = field(default_factory=dict)
    gone_since: dict[d.Key, int] = field(default_factory=dict)
    busy: set[d.Key] = field(default_factory=set)
    episodes: dict[d.Key, d.Episode] = field(default_factory=dict)
    recent: list[d.Episode] = field(default_factory=list)
    quarantined: set[d.Key] = field(default_factory=set)
    actions: list[int] = field(default_factory=list)
    jobs_per_episode: dict[int, int] = field(default_factory=dict)
    episode_no: dict[d.Key, int] = field(default_factory=dict)
    serial: int = 0

    def world(self) -> d.World:
        return d.World(
            self.now,
            self.policy,
            list(self.sick.values()),
            list(self.episodes.values()),
            self.recent,
            self.nodes,
            frozenset(self.busy),
            frozenset(self.quarantined),
            self.actions,
        )

    def step(self) -> None:
        for x in d.decide(self.world()):
            self.apply(x)
        self.check()

    def apply(self, x: d.Decision) -> None:
        if isinstance(x, d.Open):
            assert x.key not in self.episodes, "two open episodes for one GPU"
            assert x.key in self.sick
            if x.key[1] == "":
                window = self.policy.repeat_window_s * 1000
                assert not any(
                    r.key == x.key and r.state == d.QUARANTINED and self.now - r.ended_ms < window for r in self.recent
                ), "a node condition opened again within the repeat window of a failed one"
            self.serial += 1
            self.episode_no[x.key] = self.serial
            e = d.Episode(*x.key, d.QUEUED, x.action, x.match, opened_ms=self.now)
            if x.quarantine_why:
                self._end(replace(e, state=d.next_state(e.state, "quarantine")))
                self._keep_out(x.key)
            else:
                self.episodes[x.key] = e
            return
        e = self.episodes[x.key]
        if isinstance(x, d.Start):
            if e.action == "reset-when-idle":
                assert x.key not in self.busy, "an idle-window reset started while a hold is live"
            self.episodes[x.key] = replace(
                e,
                state=d.next_state(e.state, "start"),
                stage=d.first_stage(x.action),
                started_ms=self.now,
                job=d.JobOutcome("running", False),
            )
            self._job(x.key)
        elif isinstance(x, d.Escalate):
            assert e.job is not None and e.job.terminal
            assert x.key[1] != "", "a node's reboot escalated"
            self.episodes[x.key] = replace(
                e, state=d.next_state(e.state, "escalate"), stage="reboot", job=d.JobOutcome("running", False)
            )
            self._job(x.key)
        elif isinstance(x, d.Finish):
            self._end(replace(e, state=d.next_state(e.state, "finish")))
        elif isinstance(x, d.Quarantine):
            self._end(replace(e, state=d.next_state(e.state, "quarantine")))
            self._keep_out(x.key)
        elif isinstance(x, d.Clear):
            gone = self.gone_since.get(x.key)
            assert x.key not in self.sick and gone is not None
            assert self.now - gone >= self.policy.flap_window_s * 1000, "cleared before the flap window"
            self._end(replace(e, state=d.next_state(e.state, "clear")))
        elif isinstance(x, d.Seen):
            assert e.state == d.QUEUED
            self.episodes[x.key] = replace(e, clear_since_ms=x.since_ms)
        elif isinstance(x, d.Wait):
            assert e.state in d.OPEN

    def _job(self, key: d.Key) -> None:
        self.actions.append(self.now)
        n = self.episode_no[key]
        self.jobs_per_episode[n] = self.jobs_per_episode.get(n, 0) + 1
        assert self.jobs_per_episode[n] <= 2, "more than a reset and a reboot for one episode"
        assert key[1] != "" or self.jobs_per_episode[n] == 1, "more than one reboot for a node episode"

    def _keep_out(self, key: d.Key) -> None:
        """A GPU's quarantine is a cordon (`World.quarantined`); a node's is only its ended episode."""
        if key[1] != "":
            self.quarantined.add(key)

    def _end(self, e: d.Episode) -> None:
        self.episodes.pop(e.key, None)
        self.recent.append(replace(e, ended_ms=self.now))

    def check(self) -> None:
        lim = self.policy.limits
        running = {e.node_id for e in self.episodes.values() if e.state == d.RUNNING}
        assert len(running) <= lim.fleet_cap(len(self.nodes))
        if lim.per_label:
            values = [self.nodes[n].labels.get(lim.per_label) for n in running]
            present = [v for v in values if v is not None]
            assert len(present) == len(set(present)), f"two nodes of one {lim.per_label} in remediation"
        for t in self.actions:
            in_hour = [a for a in self.actions if t <= a < t + d.HOUR_MS]
            assert len(in_hour) <= lim.max_actions_per_hour, "more automatic actions in an hour than the limit"


GPUS = [("n1", "G0"), ("n1", "G1"), ("n2", "G0"), ("n3", "G0"), ("n4", "G0"), ("n4", "G1"), ("n1", ""), ("n3", "")]
"""GPUs, and two nodes' own conditions (`gpu` "")."""

events = st.one_of(
    st.tuples(st.just("sick"), st.sampled_from(GPUS), st.integers(0, len(SIGNALS) - 1)),
    st.tuples(st.just("well"), st.sampled_from(GPUS), st.just(0)),
    st.tuples(st.just("job"), st.sampled_from(GPUS), st.integers(0, 3)),
    st.tuples(st.just("hold"), st.sampled_from(GPUS), st.integers(0, 1)),
    st.tuples(st.just("link"), st.sampled_from(["n1", "n2", "n3", "n4"]), st.integers(0, 1)),
    st.tuples(st.just("time"), st.just(""), st.sampled_from([1_000, 60_000, 300_000, 900_000, 3_600_000])),
)

policies = st.builds(
    lambda nodes, pct, label, per_hour, flap, repeat, on_fail: Policy(
        flap_window_s=flap,
        repeat_window_s=repeat,
        on_reset_failure=on_fail,
        limits=Limits(max_nodes=nodes, max_fleet_percent=pct, per_label=label, max_actions_per_hour=per_hour),
    ),
    st.integers(1, 4),
    st.sampled_from([1, 25, 50, 100]),
    st.sampled_from(["", "rack"]),
    st.integers(0, 5),
    st.sampled_from([0, 60, 600]),
    st.sampled_from([60, 86_400]),
    st.sampled_from(["reboot", "quarantine"]),
)


@settings(max_examples=300, deadline=None)
@given(policy=policies, script=st.lists(events, max_size=60))
def test_limits_hold_and_each_episode_gets_one_job_under_any_sequence(
    policy: Policy, script: list[tuple[str, object, int]]
) -> None:
    racks = {"n1": "a", "n2": "a", "n3": "b", "n4": "b"}
    m = Model(policy, {n: d.NodeFacts(True, {"rack": r}) for n, r in racks.items()})
    for kind, what, n in script:
        if kind == "sick":
            assert isinstance(what, tuple)
            m.sick[what] = cond(*what, n, m.now)
            m.gone_since.pop(what, None)
        elif kind == "well":
            assert isinstance(what, tuple)
            if m.sick.pop(what, None) is not None:
                m.gone_since[what] = m.now
        elif kind == "job":
            assert isinstance(what, tuple)
            e = m.episodes.get(what)
            if e is not None and e.state == d.RUNNING and e.job is not None and not e.job.terminal:
                outcome = [
                    d.JobOutcome("done", True),
                    d.JobOutcome("done", True, reset_failed=True),
                    d.JobOutcome("failed", True, reset_failed=True, error="reset failed"),
                    d.JobOutcome("failed", True, error="batch rejected"),
                ][n]
                m.episodes[what] = replace(e, job=outcome)
        elif kind == "hold":
            assert isinstance(what, tuple)
            (m.busy.add if n else m.busy.discard)(what)
        elif kind == "link":
            assert isinstance(what, str)
            m.nodes[what] = replace(m.nodes[what], connected=bool(n))
        else:
            m.now += n
        m.step()
