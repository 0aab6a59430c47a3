"""The placement pass as one pure function: the fleet, its bookings and the pending queue in; a plan out.

Theory of operation
-------------------
`plan(nodes, bookings, pending, now_ms)` reads no clock, draws no random
number and mutates nothing: the same facts always give the same `Plan`, so a
pass that crashed half-way is simply run again from the store's rows, and the
simulator and the model check replay it exactly. The store wiring (a
singleton under a lease, woken by releases, ends, node changes, new
reservations and the plan's `next_wake_ms`) carries the plan out.

Bookings are intervals `[start_ms, end_ms)` on a node: atoms plus host
resources; `end_ms=None` is open-ended and never ends. I1 is over intervals:
two bookings may share an atom only if their intervals are disjoint, so a
window tonight is booked now, next to a hold that ends before it starts.

Pending reservations are taken in submit order (`seq`). For each, the pass
looks for the earliest instant it could start: its own start (now, or its
window's start), else the end of some booking on a node it may use. Then:

* it fits at its own start: a `Placement` (booked now; a later window start
  makes it wait with the reason `starts at T`, booked);
* it fits only later, at a bounded instant: a `Wait` with that
  `earliest_start_ms`, and the pass keeps a *hold* for it (`Wait.held`):
  the atoms and resources it would take then. Every later reservation is
  fitted around those holds, which is conservative backfill: a later one
  goes first only when it delays no earlier one's earliest start;
* it fits at no bounded instant (everything it could use is held
  open-ended, or the nodes it may use are away): a `Wait` without a start
  and without a hold. Backfill protects only bounded starts, otherwise one
  big reservation behind an open-ended hold would freeze the fleet.
* it can never fit, whatever is released (more atoms than any node has, a
  named node revoked or deleted, a window already over): a `Failure`.

NoSchedule (`bc.control.capacity.no_schedule`, the rule `bc nodes` shows): a node
that is not `connected`, is cordoned or held by a job, revoked or deleted
takes no new hold, and an unhealthy or cordoned GPU offers no atom.
Nothing here ever releases a booking: a hold on a node that went away stays
booked (I5). A reservation that names a node that is away or cordoned waits
with that reason; one that names a revoked or deleted node is refused.

Placement is first fit, deterministic: nodes in id order, and on a node its
free atoms in the order of `bc.control.capacity.atoms` (GPU index, then the atom's
numbers), preferring atoms that all sit on one NUMA node. Host resources
(CPUs, memory, 1 GiB huge pages) are booked next to the atoms and must fit
the node's totals at every instant of the interval. NUMA fit: the hold's
CPUs are pinned (`cpu_numa`) to the NUMA nodes of its GPUs when those have
the CPUs left, and its memory (`mem_numa`) when they have the memory left;
otherwise that part is not pinned. The NUMA ledger is conservative: a pinned
booking counts against every NUMA node of its pin for its whole interval.

Capabilities: a reservation that books host resources goes only to nodes
advertising `devices.limits`, a Kubernetes binding only to nodes advertising
`binding.kubernetes` (an older agent would drop the fields it does not know),
an `instance` binding (whole GPUs passed through to a VM, docs/instances.md)
only to nodes with an instance runtime (`instances.qemu`). An instance
binding's atoms are booked in the same ledger as holds', so a GPU is never
both held and passed through.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from bc.control.capacity.atoms import free_among, offered_atoms_of
from bc.control.capacity.no_schedule import reasons
from bc.protocol.atoms import DEVICE_CLASSES, GPU, GPU_MIG, Atom

CAP_LIMITS = "devices.limits"
CAP_KUBERNETES = "binding.kubernetes"
CAP_INSTANCE = "instances.qemu"
BINDINGS: tuple[str, ...] = ("hold", "kubernetes", "instance")
GIB = 1 << 30
INSTANCE_WHOLE_GPUS = "an instance reservation passes whole GPUs through (device class gpu), not MIG instances or slots"


@dataclass(frozen=True)
class HostResources:
    """CPUs, memory and 1 GiB huge pages: what a hold books next to its GPUs, or what a node has."""

    cpus: int = 0
    memory_bytes: int = 0
    hugepages_1g: int = 0

    def __add__(self, other: HostResources) -> HostResources:
        return HostResources(
            self.cpus + other.cpus, self.memory_bytes + other.memory_bytes, self.hugepages_1g + other.hugepages_1g
        )

    def fits_in(self, room: HostResources) -> bool:
        return (
            self.cpus <= room.cpus and self.memory_bytes <= room.memory_bytes and self.hugepages_1g <= room.hugepages_1g
        )

    @property
    def any(self) -> bool:
        return bool(self.cpus or self.memory_bytes or self.hugepages_1g)

    def describe(self) -> str:
        """'16 CPUs, 128 GiB memory' — only the parts asked for."""
        parts = []
        if self.cpus:
            parts.append(f"{self.cpus} CPU{'s' * (self.cpus != 1)}")
        if self.memory_bytes:
            parts.append(f"{_size(self.memory_bytes)} memory")
        if self.hugepages_1g:
            parts.append(f"{self.hugepages_1g} 1-GiB huge page{'s' * (self.hugepages_1g != 1)}")
        return ", ".join(parts)


def _size(n: int) -> str:
    return f"{n // GIB} GiB" if n % GIB == 0 else f"{n} bytes"


NO_HOST = HostResources()


@dataclass(frozen=True)
class Mig:
    gi: int
    ci: int


@dataclass(frozen=True)
class GpuInfo:
    """One GPU of a node's inventory (the fields `capacity.offered_atoms_of` reads, plus its NUMA node)."""

    index: int
    uuid: str
    numa_node: int = 0
    healthy: bool = True
    cordoned: bool = False  # out of placement by a GPU-level cordon (docs/health.md): it offers no atom, as unhealthy
    mig_enabled: bool = False
    mig_instances: tuple[Mig, ...] = ()
    slots: int = 0


@dataclass(frozen=True)
class NumaNode:
    id: int
    resources: HostResources


@dataclass(frozen=True)
class NodeInfo:
    """What the pass knows of a node; `numa=()`: no host inventory, so no host resources to book."""

    node_id: str
    connectivity: str = "connected"  # new | connected | disconnected | unreachable
    cordoned: bool = False
    job_hold: str = ""  # the job (a drain, a reboot) that holds the node, if any
    revoked: bool = False
    deleted: bool = False
    labels: Mapping[str, str] = field(default_factory=dict)
    capabilities: frozenset[str] = frozenset()
    gpus: tuple[GpuInfo, ...] = ()
    numa: tuple[NumaNode, ...] = ()
    atom_memo: dict[tuple[str, bool], tuple[Atom, ...]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    """`atoms_of`'s answers for this node: the pass keeps one NodeInfo per unchanged row across passes, and
    listing every node's atoms again on each pass was a tenth of a 1,000-node simulated fleet's time."""

    @property
    def host(self) -> HostResources:
        total = NO_HOST
        for n in self.numa:
            total = total + n.resources
        return total


def no_schedule(node: NodeInfo) -> str | None:
    """Why the node takes no new hold, as a sentence; None when it may take one.

    The rule is `bc.control.capacity.no_schedule.reasons` (what `bc nodes` shows), most lasting reason first; a
    deleted node, which `bc nodes` no longer lists, comes before all of them.
    """
    if node.deleted:
        return f"node {node.node_id} is deleted"
    why = reasons(connectivity=node.connectivity, cordoned=node.cordoned, job_hold=node.job_hold, revoked=node.revoked)
    if not why:
        return None
    if node.revoked:
        return f"node {node.node_id} is revoked; it can never bind a hold"
    if not node.cordoned and node.job_hold:
        return f"node {node.node_id} is held by job {node.job_hold}"
    return f"node {node.node_id} is {why[0]}"


@dataclass(frozen=True)
class Booking:
    """Atoms and host resources of one reservation on one node over `[start_ms, end_ms)` (None: open-ended)."""

    reservation_id: str
    node_id: str
    atoms: tuple[Atom, ...]
    start_ms: int
    end_ms: int | None
    host: HostResources = NO_HOST
    cpu_numa: tuple[int, ...] = ()
    mem_numa: tuple[int, ...] = ()

    def overlaps(self, start_ms: int, end_ms: int | None) -> bool:
        return (end_ms is None or self.start_ms < end_ms) and (self.end_ms is None or start_ms < self.end_ms)


@dataclass(frozen=True)
class Request:
    """A pending, unbooked reservation.

    `start_ms=None`: as soon as possible. The end is fixed by `end_ms`, or by `start_ms + duration_ms`
    when the window has a start; without a start, `duration_ms` runs from wherever it starts. Neither:
    open-ended.
    """

    reservation_id: str
    seq: int
    count: int
    device_class: str = GPU
    node_id: str | None = None
    selector: Mapping[str, str] = field(default_factory=dict)
    start_ms: int | None = None
    end_ms: int | None = None
    duration_ms: int | None = None
    host: HostResources = NO_HOST
    binding: str = "hold"
    avoid: frozenset[str] = frozenset()
    """Nodes that refused it at admission: never offered it again."""

    @property
    def fixed_end_ms(self) -> int | None:
        if self.end_ms is not None:
            return self.end_ms
        if self.start_ms is not None and self.duration_ms is not None:
            return self.start_ms + self.duration_ms
        return None

    def interval_at(self, t: int) -> tuple[int, int | None] | None:
        """The interval it books when it starts at `t`; None when its fixed end has passed by then."""
        end = self.fixed_end_ms
        if end is None and self.duration_ms is not None:
            end = t + self.duration_ms
        if end is not None and end <= t:
            return None
        return (t, end)

    def earliest_start(self, now_ms: int) -> int:
        return now_ms if self.start_ms is None else max(now_ms, self.start_ms)

    def capabilities(self) -> frozenset[str]:
        """What a node must advertise to take it."""
        caps = {CAP_LIMITS} if self.host.any else set()
        if self.binding == "kubernetes":
            caps.add(CAP_KUBERNETES)
        if self.binding == "instance":
            caps.add(CAP_INSTANCE)
        return frozenset(caps)


@dataclass(frozen=True)
class Placement:
    """Book now: these atoms and resources on this node over `[start_ms, end_ms)`."""

    reservation_id: str
    node_id: str
    atoms: tuple[Atom, ...]
    host: HostResources
    cpu_numa: tuple[int, ...]
    mem_numa: tuple[int, ...]
    start_ms: int
    end_ms: int | None
    reason: str | None  # `starts at T` when the window starts later: pending, booked

    def booking(self) -> Booking:
        return Booking(
            self.reservation_id,
            self.node_id,
            self.atoms,
            self.start_ms,
            self.end_ms,
            self.host,
            self.cpu_numa,
            self.mem_numa,
        )


@dataclass(frozen=True)
class Wait:
    """Stays pending, unbooked. `held`: what the pass keeps for it at its bounded earliest start."""

    reservation_id: str
    reason: str
    earliest_start_ms: int | None = None
    held: Booking | None = None


@dataclass(frozen=True)
class Failure:
    """Can never be placed: `never-fits`, `refused` (a named node revoked, deleted or unknown) or `window-passed`."""

    reservation_id: str
    code: str
    reason: str


Outcome = Placement | Wait | Failure


@dataclass(frozen=True)
class Plan:
    outcomes: tuple[Outcome, ...]  # one per pending reservation, in submit order
    ended: tuple[str, ...]  # booked reservations whose window is over: end them (`window-ended`)
    next_wake_ms: int | None  # the next window boundary the pass must run at, if any

    @property
    def placements(self) -> tuple[Placement, ...]:
        return tuple(o for o in self.outcomes if isinstance(o, Placement))

    @property
    def waits(self) -> tuple[Wait, ...]:
        return tuple(o for o in self.outcomes if isinstance(o, Wait))

    @property
    def failures(self) -> tuple[Failure, ...]:
        return tuple(o for o in self.outcomes if isinstance(o, Failure))


def iso(ms: int) -> str:
    """A store-clock instant as an operator reads it (UTC, seconds); one no datetime holds, as its ms."""
    try:
        return datetime.fromtimestamp(ms // 1000, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    except (OverflowError, ValueError, OSError):
        return f"{ms:,} ms"


def noun(device_class: str, count: int) -> str:
    one = {GPU: "GPU", GPU_MIG: "MIG instance"}.get(device_class, "GPU slot")
    return one if count == 1 else one + "s"


def atoms_of(node: NodeInfo, device_class: str, *, any_health: bool = False) -> list[Atom]:
    """The node's atoms of the class in placement order; `any_health` counts unhealthy and cordoned GPUs too (they
    may heal and be returned)."""
    key = (device_class, any_health)
    known = node.atom_memo.get(key)
    if known is None:
        gpus: Iterable[GpuInfo] = node.gpus
        if any_health:
            gpus = [dataclasses.replace(g, healthy=True, cordoned=False) for g in node.gpus]
        known = node.atom_memo[key] = tuple(offered_atoms_of(gpus, device_class))
    return list(known)


def selector_text(selector: Mapping[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(selector.items()))


def matches(node: NodeInfo, selector: Mapping[str, str]) -> bool:
    return all(node.labels.get(k) == v for k, v in selector.items())


def host_peak(bookings: Iterable[Booking], start: int, end: int | None) -> HostResources:
    """The most host resources the bookings use at any one instant of `[start, end)`, part by part."""
    over = [b for b in bookings if b.overlaps(start, end) and b.host.any]
    peak = NO_HOST
    for t in sorted({start} | {b.start_ms for b in over if b.start_ms > start}):
        at = NO_HOST
        for b in over:
            if b.start_ms <= t and (b.end_ms is None or t < b.end_ms):
                at = at + b.host
        peak = HostResources(
            max(peak.cpus, at.cpus), max(peak.memory_bytes, at.memory_bytes), max(peak.hugepages_1g, at.hugepages_1g)
        )
    return peak


def _numa_room(node: NodeInfo, numas: Sequence[int], over: Sequence[Booking]) -> tuple[int, int]:
    """(CPUs, memory) the NUMA nodes `numas` have left, counting every overlapping booking pinned to any of them."""
    ids = set(numas)
    cpus = sum(n.resources.cpus for n in node.numa if n.id in ids)
    mem = sum(n.resources.memory_bytes for n in node.numa if n.id in ids)
    cpus -= sum(b.host.cpus for b in over if ids & set(b.cpu_numa))
    mem -= sum(b.host.memory_bytes for b in over if ids & set(b.mem_numa))
    return cpus, mem


@dataclass(frozen=True)
class Fit:
    atoms: tuple[Atom, ...]
    cpu_numa: tuple[int, ...]
    mem_numa: tuple[int, ...]


def fit(node: NodeInfo, booked: Sequence[Booking], req: Request, start: int, end: int | None) -> Fit | None:
    """Where on `node` the request fits over `[start, end)` against `booked`, or None."""
    return _fit(node, atoms_of(node, req.device_class), booked, req, start, end)


def _fit(
    node: NodeInfo, offered: Sequence[Atom], booked: Sequence[Booking], req: Request, start: int, end: int | None
) -> Fit | None:
    if len(offered) < req.count:
        return None
    over = [b for b in booked if b.overlaps(start, end)]
    free = free_among(offered, (a for b in over for a in b.atoms))
    if len(free) < req.count:
        return None
    if req.host.any and not (host_peak(over, start, end) + req.host).fits_in(node.host):
        return None
    numa_of = {g.uuid: g.numa_node for g in node.gpus}
    options: list[list[Atom]] = []
    for k in sorted({numa_of[a.gpu_uuid] for a in free}):
        local = [a for a in free if numa_of[a.gpu_uuid] == k]
        if len(local) >= req.count:
            options.append(local[: req.count])
    options.append(free[: req.count])
    best: tuple[int, Fit] | None = None
    for atoms in options:
        numas = tuple(sorted({numa_of[a.gpu_uuid] for a in atoms}))
        cpu_room, mem_room = _numa_room(node, numas, over)
        cpu_pin = numas if req.host.cpus and cpu_room >= req.host.cpus else ()
        mem_pin = numas if req.host.memory_bytes and mem_room >= req.host.memory_bytes else ()
        score = bool(cpu_pin) + bool(mem_pin)
        if best is None or score > best[0]:  # ties keep the earlier option: one NUMA node, lowest first
            best = (score, Fit(tuple(atoms), cpu_pin, mem_pin))
    assert best is not None
    return best[1]


def plan(
    nodes: Sequence[NodeInfo],
    bookings: Sequence[Booking],
    pending: Sequence[Request],
    now_ms: int,
    *,
    protect: int | None = None,
) -> Plan:
    """One placement pass. See the module docstring for the policy.

    `protect` bounds how many waiting reservations the pass looks ahead for (and holds capacity for), as
    Slurm's `bf_max_job_test` does: past that many, a reservation that does not fit at its start waits
    without an estimate and without protection. None: every one is looked ahead for.
    """
    return _plan(nodes, bookings, pending, now_ms, protect)[0]


def plan_and_keep(
    nodes: Sequence[NodeInfo],
    bookings: Sequence[Booking],
    pending: Sequence[Request],
    now_ms: int,
    *,
    protect: int | None = None,
) -> tuple[Plan, Planned]:
    """`plan`, and the pass's state after its last decision (`Planned`), which `Planned.extend` continues."""
    p, state, live = _plan(nodes, bookings, pending, now_ms, protect)
    planned = Planned(
        state,
        tuple(state.fleet),
        _tally([*live, *(o.booking() for o in p.placements)]),
        max(((r.seq, r.reservation_id) for r in pending), default=None),
        frozenset(o.reservation_id for o in p.waits),
        now_ms,
        p.next_wake_ms,
    )
    return p, planned


def _plan(
    nodes: Sequence[NodeInfo], bookings: Sequence[Booking], pending: Sequence[Request], now_ms: int, protect: int | None
) -> tuple[Plan, _Pass, list[Booking]]:
    state = _Pass(sorted(nodes, key=lambda n: n.node_id), now_ms, protect)
    ended = _ended(bookings, now_ms)
    live = sorted(
        (b for b in bookings if b.end_ms is None or b.end_ms > now_ms), key=lambda b: (b.start_ms, b.reservation_id)
    )
    for b in live:
        state.add(b)
    outcomes = [state.decide(req) for req in sorted(pending, key=lambda r: (r.seq, r.reservation_id))]
    return Plan(tuple(outcomes), ended, _next_wake(live, outcomes, pending, now_ms)), state, live


def _ended(bookings: Iterable[Booking], now_ms: int) -> tuple[str, ...]:
    return tuple(sorted({b.reservation_id for b in bookings if b.end_ms is not None and b.end_ms <= now_ms}))


_LedgerKey = tuple[object, ...]


def _tally(bookings: Iterable[Booking]) -> dict[_LedgerKey, int]:
    """The bookings as a multiset of `_ledger_key`s."""
    out: dict[_LedgerKey, int] = {}
    for b in bookings:
        k = _ledger_key(b)
        out[k] = out.get(k, 0) + 1
    return out


def _ledger_key(b: Booking) -> _LedgerKey:
    """A booking as the timeline sees it: its atoms as a set (the store reads them back sorted by id, a plan
    holds them in placement order, and nothing in a fit depends on their order)."""
    atoms = tuple(sorted((a.atom_id, a.device_class, a.gpu_uuid) for a in b.atoms))
    return (b.reservation_id, b.node_id, atoms, b.start_ms, b.end_ms, b.host, b.cpu_numa, b.mem_numa)


@dataclass(frozen=True)
class Planned:
    """A plan's working state after its last decision, with what it was planned from: what a later pass continues
    when nothing it planned from has changed (docs/capacity.md, "The incremental pass").

    Pending reservations are decided in submit order and a decision only ever adds to the timeline, so one
    later in the queue cannot change an earlier one's outcome: a queue that only grew at its end is planned
    by deciding the new reservations on this state. That gives what `plan` over the whole queue would when
    the fleet and the bookings are the same, and nothing starts, ends or opens between the two instants
    (before `next_wake_ms`): the waiting reservations then decide exactly as before (a start `now` that moved
    meets only more bookings, so what did not fit still does not; the earliest start is searched over the
    same booking ends), and the state's memos hold for the same timeline with only holds added.
    """

    state: _Pass
    nodes: tuple[NodeInfo, ...]  # in id order, as the pass took them
    ledger: Mapping[_LedgerKey, int]  # the live bookings planned around, and the placements the plan booked
    last: tuple[int, str] | None  # the last (seq, id) decided: every new reservation comes after it
    waiting: frozenset[str]  # the reservations it left waiting: the pending queue it leaves behind
    now_ms: int
    next_wake_ms: int | None

    def matches(self, nodes: Sequence[NodeInfo], bookings: Sequence[Booking], now_ms: int) -> bool:
        """Whether a pass at `now_ms` over these nodes and bookings may continue this state: the same nodes, the
        same live bookings (with the plan's placements booked), no instant in between where a booking or a
        window starts or ends, or a waiting reservation may fit, and no wait whose NUMA pins a full pass would
        choose otherwise (`_Pass._note_pinned`)."""
        if not self.state.stable:
            return False
        if now_ms < self.now_ms or (self.next_wake_ms is not None and now_ms >= self.next_wake_ms):
            return False
        if tuple(sorted(nodes, key=lambda n: n.node_id)) != self.nodes:
            return False
        return _tally(b for b in bookings if b.end_ms is None or b.end_ms > now_ms) == self.ledger

    def extend(self, bookings: Sequence[Booking], pending: Sequence[Request], now_ms: int) -> tuple[Plan, Planned]:
        """The new reservations `pending` (each after `last` in submit order) decided at `now_ms`, when `matches`:
        the plan's outcomes are theirs alone, the same as `plan(nodes, bookings, waiting + pending, now_ms)`
        gives them; its `ended` and `next_wake_ms` are that plan's. This state is left as it was (a pass that
        rolls back keeps nothing), the one returned goes on from the new outcomes."""
        new = sorted(pending, key=lambda r: (r.seq, r.reservation_id))
        if new and self.last is not None and (new[0].seq, new[0].reservation_id) <= self.last:
            raise ValueError(f"{new[0].reservation_id} comes before the last reservation planned, {self.last[1]}")
        state = self.state.fork(now_ms)
        outcomes = [state.decide(req) for req in new]
        # Every instant the first plan would wake at is after `now_ms` (it has not come yet): only the new
        # outcomes add any.
        wakes = [t for t in (self.next_wake_ms, _next_wake((), outcomes, new, now_ms)) if t is not None]
        p = Plan(tuple(outcomes), _ended(bookings, now_ms), min(wakes, default=None))
        ledger = dict(self.ledger)
        for k, n in _tally(o.booking() for o in p.placements).items():
            ledger[k] = ledger.get(k, 0) + n
        last = (new[-1].seq, new[-1].reservation_id) if new else self.last
        waiting = self.waiting | {o.reservation_id for o in p.waits}
        return p, Planned(state, self.nodes, ledger, last, waiting, now_ms, p.next_wake_ms)


def _next_wake(
    live: Sequence[Booking], outcomes: Sequence[Outcome], pending: Sequence[Request], now_ms: int
) -> int | None:
    """The next instant something changes by itself: a booked window starts or ends, a wait may fit, a window opens."""
    times: set[int] = set()
    for b in [*live, *(o.booking() for o in outcomes if isinstance(o, Placement))]:
        times |= {t for t in (b.start_ms, b.end_ms) if t is not None and t > now_ms}
    times |= {o.earliest_start_ms for o in outcomes if isinstance(o, Wait) and o.earliest_start_ms is not None}
    waiting = {o.reservation_id for o in outcomes if isinstance(o, Wait)}
    for r in pending:
        if r.reservation_id in waiting:
            times |= {t for t in (r.start_ms, r.fixed_end_ms) if t is not None and t > now_ms}
    return min(times, default=None)


_Shape = tuple[object, ...]


class _Pass:
    """One pass's working state: the timeline it books into, and what it learnt that stays true for the pass.

    Within a pass bookings are only ever added, so a shape of request (class, count, resources, where, when)
    that fits nowhere at its start fits nowhere for every later request of that shape either, and one that
    has no bounded start keeps having none; remembering that is what keeps a pass over a long queue of
    similar reservations from searching the fleet again for each.
    """

    def __init__(self, fleet: Sequence[NodeInfo], now_ms: int, protect: int | None) -> None:
        self.fleet = fleet
        self.by_id = {n.node_id: n for n in fleet}
        self.now_ms = now_ms
        self.protect = protect
        self.timeline: dict[str, list[Booking]] = {n.node_id: [] for n in fleet}
        self._offered: dict[tuple[str, str], list[Atom]] = {}
        self._sizes: dict[str, list[tuple[int, NodeInfo]]] = {}
        # Each keyed by the request's shape, with the instant `base` it starts from (its own start, or now).
        self._no_fit_now: dict[_Shape, int] = {}  # it fits on no candidate at `base`
        self._no_start: dict[_Shape, int] = {}  # it has no bounded start after `base`
        self._resume: dict[_Shape, tuple[int, tuple[int, str]]] = {}  # (base, where its last hold was found)
        # Where the first-fit scan of a shape resumes: the candidates before it could not take it at `base`, and
        # a pass only adds holds, so they still cannot.
        self._fit_from: dict[_Shape, tuple[int, int]] = {}
        self._able: dict[tuple[object, ...], dict[str, NodeInfo]] = {}
        self._big: dict[tuple[str, int, frozenset[str]], list[NodeInfo]] = {}
        self._candidates: dict[_Shape, tuple[list[NodeInfo], str]] = {}
        self._ends: list[tuple[int, str]] = []  # every booking's (end, node), in time order: where fits can begin
        self._pinned_holds: dict[str, list[Booking]] = {}  # the waits' holds pinned to NUMA nodes, by node
        self.stable = True  # see `_note_pinned`

    def fork(self, now_ms: int) -> _Pass:
        """A copy to go on deciding at `now_ms`, when no booking in the timeline starts or ends after this one's
        now and up to `now_ms` (`Planned.matches`): what a decision adds is copied, the nodes' memos shared.

        What fitted nowhere from now fits nowhere from the later now either: the bookings in effect then are
        still in effect (none ended in between), and the later interval, which ends no earlier, meets all of
        them. So the shapes' fit-now answers from the old now are moved to the new one."""
        other = _Pass.__new__(_Pass)
        vars(other).update(vars(self))  # every attribute, then fresh copies of the ones a decision adds to
        other.now_ms = now_ms
        other.timeline = {node_id: list(booked) for node_id, booked in self.timeline.items()}
        other._ends = list(self._ends)
        old = self.now_ms
        other._no_fit_now = {shape: now_ms if base == old else base for shape, base in self._no_fit_now.items()}
        other._fit_from = {
            shape: (now_ms, k) if base == old else (base, k) for shape, (base, k) in self._fit_from.items()
        }
        other._no_start = dict(self._no_start)
        other._resume = dict(self._resume)
        other._pinned_holds = {node_id: list(holds) for node_id, holds in self._pinned_holds.items()}
        other._offered = dict(self._offered)
        other._sizes = dict(self._sizes)
        other._able = dict(self._able)
        other._big = dict(self._big)
        other._candidates = dict(self._candidates)
        return other

    def offered(self, node: NodeInfo, device_class: str) -> list[Atom]:
        key = (node.node_id, device_class)
        if key not in self._offered:
            self._offered[key] = atoms_of(node, device_class)
        return self._offered[key]

    def sizes(self, device_class: str) -> list[tuple[int, NodeInfo]]:
        """Every node's atoms of the class, healthy or not (GPUs heal), with the node: what never-fits reads."""
        if device_class not in self._sizes:
            self._sizes[device_class] = [(len(atoms_of(n, device_class, any_health=True)), n) for n in self.fleet]
        return self._sizes[device_class]

    def add(self, b: Booking) -> None:
        self.timeline.setdefault(b.node_id, []).append(b)
        if b.end_ms is not None:
            bisect.insort(self._ends, (b.end_ms, b.node_id))

    def decide(self, req: Request) -> Outcome:
        out = self._decide(req)
        held = out.booking() if isinstance(out, Placement) else out.held if isinstance(out, Wait) else None
        if held is not None:
            self.add(held)
            if held.cpu_numa or held.mem_numa:
                self._note_pinned(held, isinstance(out, Placement))
        return out

    def _note_pinned(self, b: Booking, placed: bool) -> None:
        """Whether a later pass could re-decide the waits of this one the same (`stable`, what `Planned.matches`
        asks). A placement is booked by then and a wait is decided again before it, with it in the timeline:
        atoms and host totals add up, so that changes nothing, but the NUMA ledger does not (a booking pinned
        to NUMA nodes 0 and 1 counts whole against each), so an earlier wait's pinned hold may pin otherwise
        next to a later pinned placement on its node. Then the next pass is a full one."""
        if not placed:
            self._pinned_holds.setdefault(b.node_id, []).append(b)
        elif any(h.overlaps(b.start_ms, b.end_ms) for h in self._pinned_holds.get(b.node_id, ())):
            self.stable = False

    def _decide(self, req: Request) -> Outcome:
        refused = _refusal(req, self.by_id, self.now_ms)
        if refused is not None:
            return refused
        never = self._never_fits(req)
        if never is not None:
            return never
        universe = [self.by_id[req.node_id]] if req.node_id is not None else self.fleet
        key = (req.node_id, tuple(sorted(req.selector.items())), req.capabilities(), req.avoid)
        if key not in self._candidates:
            usable = [n for n in universe if not (n.deleted or n.revoked or n.node_id in req.avoid)]
            self._candidates[key] = _candidates(req, usable)
        candidates, why_not = self._candidates[key]
        if not candidates:
            return Wait(req.reservation_id, why_not)
        base = req.earliest_start(self.now_ms)
        first = req.interval_at(base)
        assert first is not None  # _refusal has failed a request whose window is over
        # The request's shape, apart from the instant it would start: requests of one shape fit alike.
        shape: _Shape = (
            req.device_class,
            req.count,
            req.host,
            tuple(sorted(req.selector.items())),
            req.capabilities(),
            req.node_id,
            (req.start_ms, req.end_ms, req.duration_ms),  # how its interval moves with its start
            req.avoid,
        )
        if self._no_fit_now.get(shape) != base:
            start_k = self._fit_from.get(shape, (base, 0))
            for k in range(start_k[1] if start_k[0] == base else 0, len(candidates)):
                node = candidates[k]
                f = _fit(node, self.offered(node, req.device_class), self.timeline[node.node_id], req, *first)
                if f is not None:
                    self._fit_from[shape] = (base, k)
                    later = f"starts at {iso(base)}" if base > self.now_ms else None
                    return Placement(
                        req.reservation_id, node.node_id, f.atoms, req.host, f.cpu_numa, f.mem_numa, *first, later
                    )
            self._no_fit_now[shape] = base
        busy = _busy(req, base, self.now_ms)
        # No bounded start after one instant, none after a later one either; and the earliest-start search may
        # resume where the last of the shape found its hold when it searched from no later than this one.
        no_start = self._no_start.get(shape)
        if (no_start is not None and no_start <= base) or (self.protect is not None and self.protect <= 0):
            return Wait(req.reservation_id, busy)
        able_key = (key, req.device_class, req.count)
        if able_key not in self._able:
            self._able[able_key] = {
                n.node_id: n for n in candidates if len(self.offered(n, req.device_class)) >= req.count
            }
        resume = self._resume.get(shape)
        found = self._earliest(
            req, self._able[able_key], base, resume[1] if resume is not None and resume[0] <= base else None
        )
        if found is None:
            self._no_start[shape] = base
            return Wait(req.reservation_id, busy)
        if self.protect is not None:
            self.protect -= 1
        self._resume[shape] = (base, (found.start_ms, found.node_id))
        return Wait(req.reservation_id, busy, found.start_ms, found)

    def _earliest(
        self, req: Request, able: Mapping[str, NodeInfo], base: int, resume: tuple[int, str] | None
    ) -> Booking | None:
        """The hold at the earliest instant after `base` the request fits, on the lowest node at that instant.

        Only a node's own bookings decide when it can take the request, and a fit can only begin where one of
        them ends, so the pass walks every booking end after `base` in time order (`_ends`) and tries each on
        its node alone, stopping after the first instant that fits anywhere.
        """
        i = bisect.bisect_right(self._ends, base, key=lambda e: e[0])
        if resume is not None:
            # Where the last request of this shape found its hold: every (instant, node) before it could not
            # take the shape then, and cannot now, since a pass only adds holds. A hold added since ends where a
            # fit could begin, but one that ends before the resume point opens no fit there: if its node could
            # take the shape at that instant, the fit would have begun at an earlier end, before the resume point.
            i = max(i, bisect.bisect_left(self._ends, resume))
        while i < len(self._ends):
            t, node_id = self._ends[i]
            i += 1
            node = able.get(node_id)
            if node is None or (i > 1 and self._ends[i - 2] == (t, node_id)):
                continue  # not a node it may use, or the same instant on the same node again
            interval = req.interval_at(t)
            if interval is None:
                break
            f = _fit(node, self.offered(node, req.device_class), self.timeline[node_id], req, *interval)
            if f is not None:
                # `_ends` is sorted by (instant, node id): the first fit is the earliest instant's lowest node.
                return Booking(req.reservation_id, node_id, f.atoms, *interval, req.host, f.cpu_numa, f.mem_numa)
        return None

    def _never_fits(self, req: Request) -> Failure | None:
        """More atoms (or host resources) than any node could ever offer, whatever is released or healed."""
        what = f"{req.count} {noun(req.device_class, req.count)}"
        if req.node_id is not None:
            named = self.by_id[req.node_id]
            have = len(atoms_of(named, req.device_class, any_health=True))
            if have < req.count:
                return Failure(req.reservation_id, "never-fits", f"node {req.node_id} has {have}; {what} asked")
            if req.host.any and not req.host.fits_in(named.host):
                return Failure(
                    req.reservation_id,
                    "never-fits",
                    f"node {req.node_id} does not have {what} and {req.host.describe()}",
                )
            return None
        big_key = (req.device_class, req.count, req.avoid)
        if big_key not in self._big:
            self._big[big_key] = [
                n
                for size, n in self.sizes(req.device_class)
                if size >= req.count and not (n.deleted or n.revoked or n.node_id in req.avoid)
            ]
        big = self._big[big_key]
        refused = f" but {', '.join(sorted(req.avoid))}, which refused it," if req.avoid else ""
        if not big:
            return Failure(req.reservation_id, "never-fits", f"no node in the fleet{refused} has {what}")
        if req.host.any and not any(req.host.fits_in(n.host) for n in big):
            return Failure(
                req.reservation_id,
                "never-fits",
                f"no node in the fleet{refused} has {what} and {req.host.describe()}",
            )
        return None


def _refusal(req: Request, by_id: Mapping[str, NodeInfo], now_ms: int) -> Failure | None:
    """What no release can ever fix about this request itself (the API refuses most of it at submit)."""
    rid = req.reservation_id
    if req.device_class not in DEVICE_CLASSES:
        return Failure(rid, "refused", f"unknown device class {req.device_class!r}")
    if req.binding not in BINDINGS:
        return Failure(rid, "refused", f"unknown binding {req.binding!r}; bindings are {', '.join(BINDINGS)}")
    if req.binding == "instance" and req.device_class != GPU:
        return Failure(rid, "refused", INSTANCE_WHOLE_GPUS)
    if req.count < 1:
        return Failure(rid, "refused", f"a reservation needs at least one atom, not {req.count}")
    if req.duration_ms is not None and req.duration_ms <= 0:
        return Failure(rid, "refused", f"a duration must be positive, not {req.duration_ms} ms")
    if min(req.host.cpus, req.host.memory_bytes, req.host.hugepages_1g) < 0:
        return Failure(rid, "refused", "host resources cannot be negative")
    end = req.fixed_end_ms
    if end is not None and req.start_ms is not None and end <= req.start_ms:
        return Failure(rid, "refused", f"its window ends at {iso(end)}, before it starts at {iso(req.start_ms)}")
    if end is not None and end <= now_ms:
        return Failure(rid, "window-passed", f"its window ended at {iso(end)} before it could be placed")
    if req.node_id is not None:
        node = by_id.get(req.node_id)
        if node is None:
            return Failure(rid, "refused", f"no node named {req.node_id!r}")
        if node.deleted or node.revoked:
            return Failure(rid, "refused", no_schedule(node) or "")
    return None


def _candidates(req: Request, universe: Sequence[NodeInfo]) -> tuple[list[NodeInfo], str]:
    """The nodes the request may use now, and why there are none when there are none."""
    sel = selector_text(req.selector)
    nodes = [n for n in universe if matches(n, req.selector)]
    if not nodes:
        return [], f"no node matches {sel}"
    caps = req.capabilities()
    able = [n for n in nodes if caps <= n.capabilities]
    if not able:
        where = f" in {sel}" if sel else ""
        return [], f"no node{where} advertises {' and '.join(sorted(caps))}"
    ok = [n for n in able if no_schedule(n) is None]
    if not ok:
        why = [r for n in able[:3] if (r := no_schedule(n)) is not None]
        if req.node_id is not None:
            return [], why[0]
        more = "" if len(able) <= 3 else f" and {len(able) - 3} more"
        where = f" in {sel}" if sel else ""
        return [], f"no schedulable node{where}: {'; '.join(why)}{more}"
    return ok, ""


def _busy(req: Request, base: int, now_ms: int) -> str:
    """Why a request that could fit some day does not fit at its start."""
    what = f"{req.count} free {noun(req.device_class, req.count)}"
    if req.host.any:
        what += f" and {req.host.describe()}"
    when = f" from {iso(base)}" if base > now_ms else ""
    if req.node_id is not None:
        return f"node {req.node_id} does not have {what}{when}"
    sel = selector_text(req.selector)
    return f"no node with {what}{' in ' + sel if sel else ''}{when}"


__all__ = [
    "CAP_INSTANCE",
    "CAP_KUBERNETES",
    "CAP_LIMITS",
    "GIB",
    "Booking",
    "Failure",
    "GpuInfo",
    "HostResources",
    "Mig",
    "NodeInfo",
    "NumaNode",
    "Outcome",
    "Placement",
    "Plan",
    "Planned",
    "Request",
    "Wait",
    "fit",
    "no_schedule",
    "plan",
    "plan_and_keep",
]
