"""The placement pass under its store lease: the pure `plan` carried out in one transaction (docs/capacity.md).

Theory of operation
-------------------
A pass (`step`) locks `placement_meta`'s row first (so two passes never book from one look: PostgreSQL
holds the row lock to the commit, SQLite's single writer does the rest), reads the facts — the live
nodes with their NoSchedule facts, labels, capabilities and inventory (GPUs with their NUMA node, the
NUMA nodes' CPUs, memory and huge pages), every unreleased booking, and the pending unbooked
reservations in submit order — calls `placement_plan.plan`, and in the same transaction:

* books each `Placement`: its atoms with its interval, after checking them against the stored bookings
  on that node that meet the interval (I1, parent-aware, in the booking transaction: not only an index);
  a window that has started is delivered at once (the node's `DeviceAssignment`, with `limits` when host
  resources are booked) and is `placed`; a later window stays `pending`, booked, `starts at T`, and is
  delivered by the first pass at or after its start;
* records each `Wait`'s reason (an event only when it changed), fails each `Failure`;
* ends each reservation of `Plan.ended` with reason `window-ended`: its assignment is dropped, as a
  release drops it, and its bookings end at the window's end;
* flushes usage (`flush_usage`): every closed window of every booked hold, keyed so that a retried
  flush counts nothing twice; the next whole hour of a running hold is a wake-up too, so a flush
  happens at least hourly, and at release (`reservations.release` flushes inline) and window end.

Nothing here releases a hold because a node went away (I5): `plan` never does, and the pass only ends
windows that are over. `reserve` inserts a pending row and runs a pass inline in its own transaction, so
a reservation that fits now returns placed; `run_forever` is the singleton under the lease
`worker:placement` that runs a pass whenever the event log moves and at `Plan.next_wake_ms`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import logging
import math
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from google.protobuf import json_format

from bc.control.base.bus import Bus
from bc.control.base.events import publish
from bc.control.capacity import placement_wake
from bc.control.capacity.atoms import free_among
from bc.control.capacity.placement_plan import (
    Booking,
    Failure,
    GpuInfo,
    HostResources,
    Mig,
    NodeInfo,
    NumaNode,
    Placement,
    Plan,
    Planned,
    Request,
    Wait,
    plan,
    plan_and_keep,
)
from bc.control.capacity.placement_rows import SET_ASIDE, SetAside, admit
from bc.control.capacity.usage_windows import HOUR_MS, Span, windows_to_flush
from bc.control.nodes.specs import write_spec
from bc.control.signing.signer import Signer
from bc.errors import Conflict
from bc.protocol.atoms import Atom, parse_atom
from bc.protocol.pb import common_pb2, spec_pb2
from bc.seams.clock import Clock
from bc.store import Row, Store, StoreError, Tx, leases
from bc.store import capacity as cap_sql
from bc.store import events as events_sql
from bc.store import health as health_sql
from bc.store import nodes as nodes_sql
from bc.store import reservations as res_sql

log = logging.getLogger("bc.control.capacity.placement_pass")

LEASE_NAME = "worker:placement"
LEASE_TTL_MS = 15_000
MAX_WAIT_S = 1.0
MIN_GAP_S = 0.25
"""Passes woken by events are at least this far apart (a reservation waits at most this much longer)."""
REPLAN_GAP_S = 1.0
"""Passes for news a waiting reservation may use come at most this often (timed work keeps `MIN_GAP_S`): at a
thousand nodes some node connects every few hundred milliseconds under chaos, and each pass reads every node."""
BINDINGS: Mapping[str, int] = {
    "hold": spec_pb2.BINDING_HOLD,
    "kubernetes": spec_pb2.BINDING_KUBERNETES,
    "instance": spec_pb2.BINDING_INSTANCE,
}


# -- rows to facts --------------------------------------------------------------------------------


def cpulist_ids(text: str) -> list[int]:
    """The CPU ids of a Linux cpulist ("0-3,8,10-11"); an empty or malformed list has none."""
    out: list[int] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        try:
            a, b = int(lo), int(hi or lo)
        except ValueError:
            return []
        out.extend(range(a, b + 1))
    return out


def inventory_of(text: str) -> common_pb2.Inventory:
    inv = common_pb2.Inventory()
    json_format.Parse(text or "{}", inv, ignore_unknown_fields=True)
    return inv


INVENTORIES_KEPT = 32_768
"""Parsed inventories kept: more than a fleet has nodes. Each node's inventory is its own text (its GPUs'
UUIDs), and a pass reads them all in the same order: with 4,096 kept, a 10,000-node store missed every one,
and each pass parsed all 10,000 with json_format on the event loop (96 % of a `bc serve`'s samples over 40 s,
its loop blocked for 10-20 s at a time, past its gateway's 10 s lease fence)."""


@functools.lru_cache(maxsize=INVENTORIES_KEPT)
def _parsed(text: str) -> tuple[common_pb2.Inventory, tuple[GpuInfo, ...], tuple[NumaNode, ...]]:
    """An inventory's JSON parsed once per distinct text (a pass runs on every event; inventories rarely move).
    The Inventory returned is shared: read it, never change it."""
    inv = inventory_of(text)
    gpus = tuple(
        GpuInfo(
            index=g.index,
            uuid=g.uuid,
            numa_node=g.numa_node if g.HasField("numa_node") else 0,
            healthy=g.healthy,
            mig_enabled=g.mig_enabled,
            mig_instances=tuple(Mig(m.gi, m.ci) for m in g.mig_instances),
            slots=g.slots,
        )
        for g in inv.gpus
    )
    numa = tuple(
        NumaNode(n.id, HostResources(len(cpulist_ids(n.cpus)), n.memory_bytes, n.hugepages_1g)) for n in inv.numa_nodes
    )
    return inv, gpus, numa


def node_info(row: Row, inventory: str | None = None, cordoned_gpus: frozenset[str] = frozenset()) -> NodeInfo:
    """The planner's view of a node (a `nodes_sql.placement_nodes` row; `job_hold`, `labels` and `capabilities`
    may be absent), made once per distinct row: a pass runs on every change, and most nodes' rows do not move
    between passes. `inventory`: the inventory's text, when the row does not carry it; `cordoned_gpus`: the
    UUIDs of its GPUs a GPU-level cordon took out of placement (`bc.store.health.gpu_cordons`)."""
    text = inventory if inventory is not None else str(row["inventory"] or "{}")
    key = (
        str(row["node_id"]),
        str(row["connectivity"]),
        bool(row["cordoned"]),
        bool(row["revoked"]),
        text,
        row.get("job_hold"),
        str(row.get("labels") or ""),
        str(row.get("capabilities") or ""),
        cordoned_gpus,
    )
    hit = _NODE_INFO.get(key)
    if hit is None:
        if len(_NODE_INFO) >= 65536:  # bounded: rows that moved on are dropped wholesale, then rebuilt as needed
            _NODE_INFO.clear()
        hit = _NODE_INFO[key] = _build_node_info(row, text, cordoned_gpus)
    return hit


_NODE_INFO: dict[tuple[object, ...], NodeInfo] = {}


def _build_node_info(row: Row, text: str, cordoned_gpus: frozenset[str] = frozenset()) -> NodeInfo:
    _, gpus, numa = _parsed(text)
    if cordoned_gpus:
        gpus = tuple(dataclasses.replace(g, cordoned=True) if g.uuid in cordoned_gpus else g for g in gpus)
    labels = {str(k): str(v) for k, v in json.loads(str(row.get("labels") or "{}")).items()}
    caps = [str(c) for c in json.loads(str(row.get("capabilities") or "[]"))]
    job_hold = str(row.get("job_hold") or "")
    cordoned = bool(row["cordoned"]) and not job_hold  # the row folds a job's hold into `cordoned`
    return NodeInfo(
        node_id=str(row["node_id"]),
        connectivity=str(row["connectivity"]),
        cordoned=cordoned,
        job_hold=job_hold,
        revoked=bool(row["revoked"]),
        labels=labels,
        capabilities=frozenset(caps),
        gpus=gpus,
        numa=numa,
    )


_INVENTORY_TEXT: dict[tuple[str, str], str] = {}
"""Each node's inventory text by (node, hash): a pass reads the hashes, and the text only of a node whose hash
is new to it. The same text object every pass, so the keys above hash it once (1,000 nodes' texts read and
hashed on every pass were a fifth of a 1,000-node simulated fleet's time)."""


async def inventory_texts(tx: Tx, rows: Sequence[Row]) -> dict[str, str]:
    """Each row's inventory text: the row's own where it has no hash, else the one kept for its hash."""
    out: dict[str, str] = {}
    for r in rows:
        node_id, digest = str(r["node_id"]), str(r["inventory_hash"] or "")
        if not digest:
            out[node_id] = str(r["inventory"] or "{}")
            continue
        text = _INVENTORY_TEXT.get((node_id, digest))
        if text is None:
            got = await nodes_sql.inventory_with_hash(tx, node_id)
            text = str(got["inventory"] or "{}") if got is not None else "{}"
            if got is not None and str(got["inventory_hash"] or "") == digest:  # else it moved since: not kept
                if len(_INVENTORY_TEXT) >= INVENTORIES_KEPT:
                    _INVENTORY_TEXT.clear()
                _INVENTORY_TEXT[(node_id, digest)] = text
        out[node_id] = text
    return out


def _ints(text: object) -> tuple[int, ...]:
    return _int_list(str(text or "[]"))


@functools.lru_cache(maxsize=4096)
def _int_list(text: str) -> tuple[int, ...]:
    """A JSON list of ints (a booking's NUMA pins), parsed once per distinct text: a pass reads every live
    booking's, and a fleet has few distinct ones."""
    return tuple(int(x) for x in json.loads(text))


def host_of(row: Row) -> HostResources:
    return HostResources(int(row["cpus"] or 0), int(row["memory_bytes"] or 0), int(row["hugepages_1g"] or 0))


@functools.lru_cache(maxsize=1 << 17)
def _atom(device_class: str, atom_id: str) -> Atom:
    """`parse_atom`, once per atom: a pass reads every live booking's atoms, and matching each id's pattern
    again was half of reading them (0.1 s of a pass over 8,000 booked atoms)."""
    return parse_atom(device_class, atom_id)


def bookings_of(rows: Iterable[Row]) -> list[Booking]:
    """One `Booking` per reservation from its atom rows (they share the interval)."""
    grouped: dict[str, list[Row]] = {}
    for r in rows:
        grouped.setdefault(str(r["reservation_id"]), []).append(r)
    out = []
    for rid, atoms in grouped.items():
        first = atoms[0]
        end = first["end_ms"]
        out.append(
            Booking(
                reservation_id=rid,
                node_id=str(first["node_id"]),
                atoms=tuple(_atom(str(a["device_class"]), str(a["atom_id"])) for a in atoms),
                start_ms=int(first["start_ms"]),
                end_ms=None if end is None else int(end),
                host=host_of(first),
                cpu_numa=_ints(first["cpu_numa"]),
                mem_numa=_ints(first["mem_numa"]),
            )
        )
    return out


def request_of(row: Row) -> Request:
    def opt(k: str) -> int | None:
        v = row[k]
        return None if v is None else int(v)

    return Request(
        reservation_id=str(row["id"]),
        seq=int(row["seq"]),
        count=int(row["gpus"]),
        device_class=str(row["device_class"]),
        node_id=str(row["want_node_id"]) if row["want_node_id"] else None,
        selector={str(k): str(v) for k, v in json.loads(str(row["selector"] or "{}")).items()},
        start_ms=opt("start_ms"),
        end_ms=opt("end_ms"),
        duration_ms=opt("duration_ms"),
        host=host_of(row),
        binding=str(row["binding"]),
        avoid=frozenset(str(n) for n in json.loads(str(row["avoid_nodes"] or "[]"))),
    )


# -- the node's assignment --------------------------------------------------------------------------


def limits_of(
    host: HostResources, cpu_numa: Sequence[int], mem_numa: Sequence[int], inv: common_pb2.Inventory
) -> spec_pb2.ResourceLimits | None:
    """`DeviceAssignment.limits` for booked host resources: cpus/mems on the pinned NUMA nodes; None: none booked."""
    if not host.any:
        return None
    lim = spec_pb2.ResourceLimits(
        cpu_millis=host.cpus * 1000, memory_bytes=host.memory_bytes, hugepages_1gi=host.hugepages_1g
    )
    if cpu_numa:
        ids = sorted({c for n in inv.numa_nodes if n.id in set(cpu_numa) for c in cpulist_ids(n.cpus)})
        lim.cpus = _cpulist(ids)
    if mem_numa:
        lim.mems = ",".join(str(n) for n in sorted(mem_numa))
    return lim


def _cpulist(ids: Sequence[int]) -> str:
    parts: list[str] = []
    i = 0
    while i < len(ids):
        j = i
        while j + 1 < len(ids) and ids[j + 1] == ids[j] + 1:
            j += 1
        parts.append(str(ids[i]) if i == j else f"{ids[i]}-{ids[j]}")
        i = j + 1
    return ",".join(parts)


def add_assignment(
    allocation_id: str,
    reservation_id: str,
    binding: str,
    atoms: Sequence[Atom],
    limits: spec_pb2.ResourceLimits | None,
) -> Callable[[spec_pb2.NodeSpec], None]:
    def mutate(spec: spec_pb2.NodeSpec) -> None:
        da = spec.devices.assignments.add(
            allocation_id=allocation_id, reservation_id=reservation_id, binding=BINDINGS[binding]
        )
        for a in atoms:
            da.devices.add(device_class=a.device_class, atom_id=a.atom_id)
        if limits is not None:
            da.limits.CopyFrom(limits)

    return mutate


def drop_assignment(allocation_id: str) -> Callable[[spec_pb2.NodeSpec], None]:
    def mutate(spec: spec_pb2.NodeSpec) -> None:
        keep = [a for a in spec.devices.assignments if a.allocation_id != allocation_id]
        del spec.devices.assignments[:]
        spec.devices.assignments.extend(keep)
        if not keep:
            spec.ClearField("devices")

    return mutate


# -- usage ------------------------------------------------------------------------------------------


def span_of(row: Row) -> Span:
    """A booked reservation as billing sees it (`cap_sql.unflushed_spans`' row)."""

    def opt(k: str) -> int | None:
        v = row[k]
        return None if v is None else int(v)

    return Span(
        reservation_id=str(row["id"]),
        node_id=str(row["node_id"]),
        tenant=str(row["tenant"]),
        device_class=str(row["device_class"]),
        atoms=int(row["gpus"]),
        window_start_ms=opt("window_start_ms"),
        window_end_ms=opt("window_end_ms"),
        placed_at_ms=int(row["placed_at_ms"]),
        released_at_ms=opt("ended_at_ms"),
    )


async def flush_usage(tx: Tx, now_ms: int, reservation_id: str = "") -> int | None:
    """Write every closed usage window not yet written (of one reservation, or of all); returns the next
    instant a window closes (the next whole hour of a hold still running), if any.

    A window is keyed (reservation, start) and inserted with ON CONFLICT DO NOTHING, and a flush resumes at
    the end of the last committed window, so a retried or crashed flush never counts a second twice."""
    next_cut: int | None = None
    for row in await cap_sql.unflushed_spans(tx, reservation_id):
        span = span_of(row)
        flushed = None if row["flushed_ms"] is None else int(row["flushed_ms"])
        for w in windows_to_flush(span, flushed, now_ms):
            await cap_sql.insert_usage_window(
                tx,
                reservation_id=w.reservation_id,
                start_ms=w.start_ms,
                end_ms=w.end_ms,
                node_id=w.node_id,
                tenant=w.tenant,
                device_class=w.device_class,
                atoms=w.atoms,
            )
        end = span.usage_end_ms
        if end is None or end > now_ms:
            cut = (max(now_ms, span.usage_start_ms) // HOUR_MS + 1) * HOUR_MS
            cut = cut if end is None else min(cut, end)
            next_cut = cut if next_cut is None else min(next_cut, cut)
    return next_cut


# -- the pass ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Fleet:
    """What every pass reads in full: the live nodes, their inventories and the unreleased bookings."""

    nodes: list[NodeInfo]
    inventories: dict[str, common_pb2.Inventory]
    booking_rows: list[Row]
    bookings: list[Booking]


@dataclass(frozen=True)
class Facts(Fleet):
    """What a full pass reads: the fleet (role `node` nodes, their inventories, the unreleased bookings) and
    the queue."""

    pending: list[Request]
    reasons: dict[str, str]  # each pending reservation's stored wait reason
    set_aside: tuple[SetAside, ...] = ()  # pending rows out of the limits' bounds: never planned (issue 29)


async def load_fleet(tx: Tx) -> Fleet:
    rows = await nodes_sql.placement_nodes(tx)
    texts = await inventory_texts(tx, rows)
    booking_rows = await cap_sql.live_bookings(tx)
    cordoned: dict[str, set[str]] = {}
    for c in await health_sql.gpu_cordons(tx):
        cordoned.setdefault(str(c["node_id"]), set()).add(str(c["gpu_uuid"]))
    return Fleet(
        nodes=[node_info(r, texts[str(r["node_id"])], frozenset(cordoned.get(str(r["node_id"]), ()))) for r in rows],
        inventories={node_id: _parsed(text)[0] for node_id, text in texts.items()},
        booking_rows=booking_rows,
        bookings=bookings_of(booking_rows),
    )


def _with_queue(fleet: Fleet, pending_rows: Sequence[Row]) -> Facts:
    pending, set_aside = admit(pending_rows, request_of)
    return Facts(
        nodes=fleet.nodes,
        inventories=fleet.inventories,
        booking_rows=fleet.booking_rows,
        bookings=fleet.bookings,
        pending=pending,
        reasons={str(r["id"]): str(r["reason"] or "") for r in pending_rows},
        set_aside=tuple(set_aside),
    )


async def load_facts(tx: Tx) -> Facts:
    return _with_queue(await load_fleet(tx), await cap_sql.pending_unbooked(tx))


async def load_new_facts(tx: Tx, fleet: Fleet, kept: Planned) -> Facts | None:
    """The facts with only the pending reservations `kept` has not planned, when the queue is the one it left
    waiting plus reservations after its last in submit order; None when any other changed (one released or
    failed, a placed one its node refused back in the queue, one committed late with an earlier number)."""
    seq, id_ = kept.last if kept.last is not None else (-1, "")
    rows = await cap_sql.pending_unbooked_after(tx, seq, id_)
    if set(await cap_sql.pending_unbooked_ids(tx)) != kept.waiting | {str(r["id"]) for r in rows}:
        return None
    return _with_queue(fleet, rows)


@dataclass(frozen=True)
class PassResult:
    plan: Plan
    delivered: tuple[str, ...]  # reservations placed on their node's spec by this pass
    ended: tuple[str, ...]  # reservations this pass ended (`window-ended`)
    incremental: bool = False
    """The pass decided only the reservations new since the last: `plan.outcomes` are theirs alone."""


class PlacementPass:
    # Seams only for the simulator's deliberately broken passes (`bc.sim.breaks`): production never sets them.
    planner = staticmethod(plan)
    """The pure planner (`--break double-book` substitutes one blind to the bookings)."""
    flush = staticmethod(flush_usage)
    """The usage flush (`--break double-count-usage` substitutes one that counts windows twice)."""

    def __init__(self, store: Store, bus: Bus, signer: Signer, rng: random.Random, *, holder: str) -> None:
        self.store, self.bus, self.signer, self.rng, self.holder = store, bus, signer, rng, holder
        self.next_wake_ms: int | None = None
        self.seen_seq: int | None = None
        """The event log's last seq when the last pass read its facts: later waking events are news to it."""
        self.kept: Planned | None = None
        """The last committed pass's planner state and what it planned from: the next pass goes on from it."""

    async def pass_once(self, *, lease: bool = True, full: bool = False) -> PassResult | None:
        """One pass in its own transaction (`full`: re-plan the whole queue); None without the store lease
        (another process runs the pass)."""
        now_ms = await self.store.now_ms()
        async with self.store.transaction() as tx:
            if lease and not await leases.acquire(tx, LEASE_NAME, self.holder, now_ms, LEASE_TTL_MS):
                return None
            return await self.step(tx, now_ms, full=full)

    async def run_forever(self, clock: Clock) -> None:
        """Pass when the event log moves and at the plan's next wake, at most once per `MIN_GAP_S`.

        A pass that could place, deliver, end or flush nothing is skipped (`_has_work`): no booked window's
        start has come, the plan's next wake (a window's start or end, a usage cut) is still ahead, and no
        event since the last pass can let a waiting reservation fit (`placement_wake`). A full pass still runs
        at least every third of the lease's TTL, which keeps the lease and bounds what a skip can delay, and a
        pass re-plans the whole queue as often; the others decide only what is new when nothing else changed
        (`step`)."""
        last_full = last_replan = -math.inf
        while True:
            started = clock.monotonic()
            try:
                if (
                    self.seen_seq is None
                    or started - last_full >= LEASE_TTL_MS / 3000
                    or await self._has_work(self.next_wake_ms, self.seen_seq, started - last_full >= REPLAN_GAP_S)
                ):
                    last_full = started
                    # The whole queue is re-planned as often as a pass is forced: what an incremental pass
                    # could ever miss is seconds late, as what `_has_work` misses.
                    replan = started - last_replan >= LEASE_TTL_MS / 3000
                    if replan:
                        last_replan = started
                    await self.pass_once(full=replan)
            except StoreError as e:
                log.warning("event=placement.pass-failed error=%s", e)
            except Exception:  # a bug must not end placement for good: the pass rolled back; log it, go on
                log.exception("event=placement.pass-crashed")
            timeout = MAX_WAIT_S
            if self.next_wake_ms is not None:
                try:
                    now_ms = await self.store.now_ms()
                    timeout = min(MAX_WAIT_S, max(0.0, (self.next_wake_ms - now_ms) / 1000))
                except StoreError:
                    pass
            await self.bus.wait_events(timeout)
            # Events come in bursts (a fleet's heartbeats and reports): one pass answers them all.
            rest = MIN_GAP_S - (clock.monotonic() - started)
            if rest > 0:
                await asyncio.sleep(rest)

    async def _has_work(self, next_wake_ms: int | None, seen_seq: int, replan: bool) -> bool:
        """Whether a pass now could do anything: the plan's next wake (a window's end, a usage cut) reached, a
        booked window whose start has come, or (when `replan`: `REPLAN_GAP_S` since the last pass) an event
        since the last pass that may let a reservation in the queue fit. Waking events read while the queue is
        empty are spent: a new reservation is news; ones not yet due for a replan wait for the next look."""
        now_ms = await self.store.now_ms()
        if next_wake_ms is not None and now_ms >= next_wake_ms:
            return True
        async with self.store.transaction(write=False) as tx:
            if await cap_sql.has_due_window(tx, now_ms):
                return True
            if not replan:
                return False
            news = await events_sql.of_types_since(tx, seen_seq, placement_wake.WAKING_TYPES)
            if not news:
                return False
            waking = any(placement_wake.may_fit_more(str(e["type"]), str(e["data"])) for e in news)
            if waking and await cap_sql.has_unbooked_pending(tx):
                return True
        if self.seen_seq == seen_seq:  # no pass ran meanwhile: these events are spent
            self.seen_seq = int(news[-1]["seq"])
        return False

    async def step(self, tx: Tx, now_ms: int, *, full: bool = False) -> PassResult:
        """One pass inside the caller's transaction (a `reserve` runs it inline).

        Incremental unless `full`: when the last pass of this object committed, nothing it planned from has
        changed (`Planned.matches`) and the queue only grew at its end (`load_new_facts`), only the new
        reservations are decided, on that pass's state; the plan's `outcomes` are then theirs alone. Anything
        else is a full pass."""
        lock = self.store.for_update()
        await cap_sql.lock_pass(tx, self.store.dialect)
        seen = await events_sql.last_seq(tx)
        tx.on_commit(lambda: setattr(self, "seen_seq", seen))  # a pass rolled back has seen nothing
        fleet = await load_fleet(tx)
        kept = None if full or self.planner is not plan else self.kept
        facts = None
        if kept is not None and kept.matches(fleet.nodes, fleet.bookings, now_ms):
            facts = await load_new_facts(tx, fleet, kept)
        if facts is None:
            kept = None
            facts = _with_queue(fleet, await cap_sql.pending_unbooked(tx))
        await self._set_aside(tx, facts.set_aside, now_ms)
        bookings, pending, inventories = facts.bookings, facts.pending, facts.inventories
        state_of = {str(r["reservation_id"]): (str(r["state"]), str(r["allocation_id"])) for r in facts.booking_rows}
        planned: Planned | None = None
        if kept is not None:
            p, planned = kept.extend(bookings, pending, now_ms)
        elif self.planner is plan:
            p, planned = plan_and_keep(facts.nodes, bookings, pending, now_ms)
        else:
            p = self.planner(facts.nodes, bookings, pending, now_ms)
        # What the next pass may go on from, once this one is stored: a pass rolled back leaves the last one's.
        tx.on_commit(lambda: setattr(self, "kept", planned))
        by_id = {r.reservation_id: r for r in pending}
        ended = await self._end(tx, p.ended, state_of, bookings, now_ms, lock)
        for o in p.outcomes:
            if isinstance(o, Placement):
                await self._book(tx, o, by_id[o.reservation_id], now_ms)
            elif isinstance(o, Wait):
                if facts.reasons.get(o.reservation_id) != o.reason and await cap_sql.set_wait_reason(
                    tx, o.reservation_id, o.reason
                ):
                    data: dict[str, object] = {"reason": o.reason}
                    if o.earliest_start_ms is not None:
                        data["earliest_start_ms"] = o.earliest_start_ms
                    await publish(tx, self.bus, "reservation.waiting", o.reservation_id, data, now_ms)
            elif isinstance(o, Failure) and await cap_sql.settle(
                tx, o.reservation_id, "failed", o.reason, now_ms, ("pending",)
            ):
                data = {"code": o.code, "reason": o.reason}
                await publish(tx, self.bus, "reservation.failed", o.reservation_id, data, now_ms)
        delivered = []
        for row in await cap_sql.due_windows(tx, now_ms):
            await self._deliver(tx, row, inventories, now_ms, lock)
            delivered.append(str(row["id"]))
        cut = await self.flush(tx, now_ms)
        self.next_wake_ms = min((t for t in (p.next_wake_ms, cut) if t is not None), default=None)
        return PassResult(p, tuple(delivered), ended, incremental=kept is not None)

    async def _set_aside(self, tx: Tx, rows: Sequence[SetAside], now_ms: int) -> None:
        """Fail each pending row the planner must not see, naming it in `reservation.set-aside` (and
        `reservation.failed`, which every watcher of a reservation's end already reads)."""
        for a in rows:
            reason = f"{SET_ASIDE}: {a.problem}"
            if await cap_sql.settle(tx, a.reservation_id, "failed", reason, now_ms, ("pending",)):
                log.warning("event=placement.row-set-aside reservation=%s problem=%r", a.reservation_id, a.problem)
                data: dict[str, object] = {"reason": reason, "problem": a.problem}
                await publish(tx, self.bus, f"reservation.{SET_ASIDE}", a.reservation_id, data, now_ms)
                await publish(
                    tx, self.bus, "reservation.failed", a.reservation_id, {"code": SET_ASIDE, "reason": reason}, now_ms
                )

    async def check_stored_bookings(self, tx: Tx, o: Placement) -> None:
        """I1 in the booking transaction: the placement's atoms are free in the stored bookings that meet its
        interval on the node (a method so the simulator's `--break double-book` can skip it too)."""
        stored = await cap_sql.overlapping(tx, o.node_id, o.start_ms, o.end_ms)
        taken = [parse_atom(str(r["device_class"]), str(r["atom_id"])) for r in stored]
        if len(free_among(o.atoms, taken)) != len(o.atoms):
            raise Conflict(f"placement of {o.reservation_id} on {o.node_id} overlaps a stored booking (I1); not booked")

    async def _book(self, tx: Tx, o: Placement, req: Request, now_ms: int) -> None:
        """Book a placement, checking I1 against the stored bookings that meet its interval on the node."""
        await self.check_stored_bookings(tx, o)
        for a in o.atoms:
            await cap_sql.book_atom(
                tx,
                reservation_id=o.reservation_id,
                node_id=o.node_id,
                device_class=a.device_class,
                atom_id=a.atom_id,
                gpu_uuid=a.gpu_uuid,
                start_ms=o.start_ms,
                end_ms=o.end_ms,
                now_ms=now_ms,
            )
        await cap_sql.set_booked(
            tx,
            o.reservation_id,
            o.node_id,
            json.dumps(list(o.cpu_numa)),
            json.dumps(list(o.mem_numa)),
            o.reason or "",
            now_ms,
        )
        await publish(
            tx,
            self.bus,
            "reservation.booked",
            o.reservation_id,
            {
                "node_id": o.node_id,
                "atoms": [a.atom_id for a in o.atoms],
                "start_ms": o.start_ms,
                "end_ms": o.end_ms,
                "binding": req.binding,
            },
            now_ms,
        )

    async def _deliver(
        self, tx: Tx, row: Row, inventories: Mapping[str, common_pb2.Inventory], now_ms: int, lock: str
    ) -> None:
        """A booked window that has started: its assignment goes into the node's spec, and it is `placed`."""
        rid, node_id, alloc = str(row["id"]), str(row["node_id"]), str(row["allocation_id"])
        atoms = [parse_atom(str(b["device_class"]), str(b["atom_id"])) for b in await res_sql.bookings(tx, rid)]
        limits = limits_of(
            host_of(row),
            _ints(row["cpu_numa"]),
            _ints(row["mem_numa"]),
            inventories.get(node_id, common_pb2.Inventory()),
        )
        w = await write_spec(
            tx,
            self.bus,
            self.signer,
            node_id,
            add_assignment(alloc, rid, str(row["binding"]), atoms, limits),
            now_ms,
            lock=lock,
        )
        await cap_sql.set_delivered(tx, rid, w.generation)
        await publish(
            tx,
            self.bus,
            "reservation.placed",
            rid,
            {
                "node_id": node_id,
                "allocation_id": alloc,
                "atoms": [a.atom_id for a in atoms],
                "generation": w.generation,
            },
            now_ms,
        )

    async def _end(
        self,
        tx: Tx,
        ended: Sequence[str],
        state_of: Mapping[str, tuple[str, str]],
        bookings: Sequence[Booking],
        now_ms: int,
        lock: str,
    ) -> tuple[str, ...]:
        """End the reservations whose window is over: the assignment dropped (if delivered), the bookings freed."""
        node_of = {b.reservation_id: b.node_id for b in bookings}
        end_of = {b.reservation_id: b.end_ms or now_ms for b in bookings}
        out = []
        for rid in ended:
            state, alloc = state_of.get(rid, ("", ""))
            if state not in ("pending", "placed", "active", "lost"):
                continue  # releasing: the node's report settles it; failed/released: nothing booked
            if state != "pending":
                await write_spec(tx, self.bus, self.signer, node_of[rid], drop_assignment(alloc), now_ms, lock=lock)
            await cap_sql.settle(tx, rid, "ended", "window-ended", now_ms, (state,), end_ms=end_of[rid])
            await res_sql.release_bookings(tx, rid, now_ms)
            await publish(
                tx, self.bus, "reservation.ended", rid, {"node_id": node_of[rid], "reason": "window-ended"}, now_ms
            )
            out.append(rid)
        return tuple(out)


__all__ = [
    "LEASE_NAME",
    "PassResult",
    "PlacementPass",
    "add_assignment",
    "drop_assignment",
    "flush_usage",
    "limits_of",
    "load_facts",
    "load_fleet",
    "span_of",
]
