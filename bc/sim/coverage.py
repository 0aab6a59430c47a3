"""How often each invariant's dangerous situation happened in a run (`bc sim --coverage`). Pure: no I/O.

A checker that passes says something only if the situation it is about happened: I2 holds trivially in a
run where no node restarted with a command in flight. So each invariant gets a count, read from the same
facts the checkers read (`bc.sim.facts.FactLog`), of the moments a wrong component would have gone wrong:

    I1  an atom handed from one reservation to another on a node (where a placement blind to bookings
        double-books)
    I2  a command frame delivered again to a node (a duplicate, a replay after a reconnect or a restart), or a
        command started on a node shortly before its agent restarted or its journal was lost (where a
        journal that forgot its accepts, or never made them durable, runs it again)
    I3  a spec delivered shortly before its node went away (where convergence must survive the outage);
        and a spec delivered older than the one its node applied (where an agent that takes whatever
        arrives last goes back)
    I4  a session closed (where liveness without grace marks a node unreachable too early)
    I5  a node went away, or lost its journal, while it held a reservation's atoms (where liveness releases
        what it must not, or the node drops a hold it no longer finds in its spec)
    I7  a reservation made to wait in the pending queue during the run, or still pending at the end (what
        the brute-force solver is asked about)
    I8  a usage window closed (where a flush written twice double-counts)
    Q1  a batch one key or one operator approved more than once (where a count that takes a signer twice
        approves it on fewer than k people)
    H1  (`--health` only) episodes a limit made wait (where a reconciler blind to its limits starts them
        all), episodes on a GPU under a live hold (where one resets or releases it), flapping conditions (where
        one makes a job per flap), GPUs sick again after an episode (where one remediates them again), failed
        resets (where the reboot follows)

A run where one happened fewer than `FEW` times says so: its checker's pass is weak evidence.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterable
from dataclasses import dataclass

from bc.sim.facts import FactLog
from bc.sim.health_facts import EpisodeRun, GpuHold, HealthFacts
from bc.sim.storms import GPU_FLAP

FEW = 10
NEAR_MS = 60_000
"""How close before a restart or an outage a command start or a spec delivery counts as in flight."""

AWAY = frozenset({"disconnected", "unreachable", "lost"})


@dataclass(frozen=True)
class Situation:
    invariant: str
    what: str
    count: int

    @property
    def few(self) -> bool:
        return self.count < FEW


def _near_before(starts: list[int], t_ms: int) -> bool:
    return any(t_ms - NEAR_MS <= s <= t_ms for s in starts)


def _by_node(pairs: Iterable[tuple[str, int]]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for node_id, t in pairs:
        out.setdefault(node_id, []).append(t)
    return out


def atoms_handed_over(facts: FactLog) -> int:
    """I1: consecutive bookings of one atom on one node by two reservations."""
    per_atom: dict[tuple[str, str], list[tuple[int, str]]] = {}
    for b in facts.bookings:
        for a in b.atoms:
            per_atom.setdefault((b.node_id, a.atom_id), []).append((b.start_ms, b.reservation_id))
    handed = 0
    for uses in per_atom.values():
        uses.sort()
        handed += sum(1 for (_, r1), (_, r2) in itertools.pairwise(uses) if r1 != r2)
    return handed


def commands_in_flight_at_restart(facts: FactLog) -> int:
    """I2: command frames delivered again, restarts and journal losses that came within `NEAR_MS` of a command
    starting on their node, and the commands a lost journal held accepted or running."""
    started = _by_node((e.node_id, e.t_ms) for e in facts.side_effects)
    n = len(facts.redeliveries)
    n += sum(1 for r in facts.restarts if _near_before(started.get(r.node_id, []), r.t_ms))
    for loss in facts.journal_losses:
        n += len(loss.in_flight) or int(_near_before(started.get(loss.node_id, []), loss.t_ms))
    return n


def specs_then_away(facts: FactLog) -> int:
    """I3: deliveries followed within `NEAR_MS` by an outage of their node (or of every node)."""
    n = 0
    for d in facts.deliveries:
        if any(
            (o.node_id is None or o.node_id == d.node_id) and d.t_ms <= o.start_ms <= d.t_ms + NEAR_MS
            for o in facts.outages
        ):
            n += 1
    return n


def stale_specs_delivered(facts: FactLog) -> int:
    """I3: deliveries of a generation below the one the node's journal held in force when it arrived (the
    last spec it applied before, in the taps' order, unless a journal loss came between)."""
    applied: dict[str, list[tuple[int, int, int]]] = {}  # node -> (t_ms, seq, generation), in order
    for a in sorted(facts.applied, key=lambda a: (a.t_ms, a.seq)):
        applied.setdefault(a.node_id, []).append((a.t_ms, a.seq, a.generation))
    losses = _by_node((lo.node_id, lo.t_ms) for lo in facts.journal_losses)
    n = 0
    for d in facts.deliveries:
        mine = applied.get(d.node_id, [])
        i = bisect.bisect_left(mine, (d.t_ms, d.seq, -1)) - 1
        if i < 0:
            continue
        t_applied, _seq, generation = mine[i]
        if d.generation < generation and not any(t_applied <= t <= d.t_ms for t in losses.get(d.node_id, ())):
            n += 1
    return n


def sessions_closed(facts: FactLog) -> int:
    """I4: a node's connectivity became `disconnected`."""
    return sum(1 for c in facts.connectivity if c.state == "disconnected")


def away_while_holding(facts: FactLog) -> int:
    """I5: a node went away, or lost its journal, while a binding on it was live."""
    moments = [(c.node_id, c.t_ms) for c in facts.connectivity if c.state in AWAY]
    moments += [(lo.node_id, lo.t_ms) for lo in facts.journal_losses]
    held = _by_node_bound(facts)
    return sum(
        1
        for node_id, t in moments
        if any(start <= t and (end is None or t < end) for start, end in held.get(node_id, ()))
    )


def _by_node_bound(facts: FactLog) -> dict[str, list[tuple[int, int | None]]]:
    out: dict[str, list[tuple[int, int | None]]] = {}
    for b in facts.bound:
        out.setdefault(b.node_id, []).append((b.start_ms, b.end_ms))
    return out


def waited_or_pending(facts: FactLog) -> int:
    """I7: reservations made to wait during the run, and those still pending at the end (counted once)."""
    ids = set(facts.waited)
    if facts.quiet is not None:
        ids.update(r.reservation_id for r, _held in facts.quiet.pending)
    return len(ids)


def batches_signed_twice(facts: FactLog) -> int:
    """Q1: batches whose approve decisions hold one key, or one operator, more than once."""
    return sum(1 for d in facts.batch_decisions if d.repeats)


def coverage(facts: FactLog) -> list[Situation]:
    """One `Situation` per invariant (two for I3), in order I1..I8 then Q1; then H1's five in a `--health` run."""
    out = [
        Situation("I1", "atoms handed from one reservation to another", atoms_handed_over(facts)),
        Situation(
            "I2",
            "commands delivered again, or in flight at a restart or journal loss",
            commands_in_flight_at_restart(facts),
        ),
        Situation("I3", "specs delivered just before their node went away", specs_then_away(facts)),
        Situation("I3", "specs delivered older than the one their node applied", stale_specs_delivered(facts)),
        Situation("I4", "sessions closed", sessions_closed(facts)),
        Situation("I5", "nodes away, or losing their journal, while holding a reservation", away_while_holding(facts)),
        Situation("I7", "reservations made to wait, or pending at the end", waited_or_pending(facts)),
    ]
    out.append(Situation("I8", "usage windows closed", len(facts.windows)))
    out.append(Situation("Q1", "batches one person approved twice", batches_signed_twice(facts)))
    if facts.health is not None:
        out += health_situations(facts.health)
    return out


def health_situations(h: HealthFacts) -> list[Situation]:
    """H1's dangerous situations (see the module docstring)."""
    limited = {w.episode_id for w in h.waits if w.on_a_limit}
    holds: dict[tuple[str, str], list[GpuHold]] = {}
    for x in h.holds:
        holds.setdefault((x.node_id, x.gpu), []).append(x)

    def held(e: EpisodeRun) -> bool:
        q, end = e.open_span()
        return any(x.start_ms < (end or 1 << 62) and (x.end_ms is None or x.end_ms > q) for x in holds.get(e.key, ()))

    seen: set[tuple[str, str]] = set()
    repeats = 0
    for e in sorted(h.episodes, key=lambda e: (e.queued_ms, e.episode_id)):
        repeats += e.key in seen
        seen.add(e.key)
    return [
        Situation("H1", "episodes a limit made wait", len(limited)),
        Situation("H1", "episodes on a GPU under a live hold", sum(1 for e in h.episodes if held(e))),
        Situation("H1", "conditions made to flap", h.injected.get(GPU_FLAP, 0)),
        Situation("H1", "GPUs sick again after an episode", repeats),
        Situation("H1", "failed resets escalated to a reboot", sum(len(e.escalations) for e in h.episodes)),
    ]


__all__ = ["FEW", "Situation", "coverage"]
