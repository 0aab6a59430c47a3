"""Small fleets, bookings and requests for the capacity core's tests, in as few words as a test can read."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from bc.control.capacity.placement_plan import (
    CAP_KUBERNETES,
    CAP_LIMITS,
    GIB,
    Booking,
    GpuInfo,
    HostResources,
    Mig,
    NodeInfo,
    NumaNode,
    Outcome,
    Placement,
    Plan,
    Request,
    Wait,
)
from bc.protocol.atoms import GPU, Atom, parse_atom

H = 3_600_000
M = 60_000
ALL_CAPS = frozenset({CAP_LIMITS, CAP_KUBERNETES})


def node(
    node_id: str,
    gpus: int = 4,
    *,
    numa: int = 1,
    cpus: int = 32,
    mem_gib: int = 256,
    hugepages: int = 0,
    unhealthy: Iterable[int] = (),
    slots: int = 0,
    mig: Iterable[int] = (),
    caps: frozenset[str] = ALL_CAPS,
    **kw: Any,
) -> NodeInfo:
    """`gpus` GPUs spread evenly over `numa` NUMA nodes, which share the CPUs, memory and huge pages evenly.

    Every GPU offers `slots` shared slots; the GPUs in `mig` are MIG-enabled with two instances (1/0, 2/0).
    """
    sick, migs = set(unhealthy), set(mig)
    return NodeInfo(
        node_id,
        gpus=tuple(
            GpuInfo(
                i,
                gpu(node_id, i),
                numa_node=i * numa // gpus,
                healthy=i not in sick,
                mig_enabled=i in migs,
                mig_instances=(Mig(1, 0), Mig(2, 0)) if i in migs else (),
                slots=slots,
            )
            for i in range(gpus)
        ),
        numa=tuple(
            NumaNode(k, HostResources(cpus // numa, mem_gib * GIB // numa, hugepages // numa)) for k in range(numa)
        ),
        capabilities=caps,
        **kw,
    )


def gpu(node_id: str, index: int) -> str:
    return f"{node_id}-gpu{index}"


def atoms(node_id: str, *indexes: int) -> tuple[Atom, ...]:
    return tuple(parse_atom(GPU, gpu(node_id, i)) for i in indexes)


def booking(
    rid: str, node_id: str, indexes: Iterable[int], start: int = 0, end: int | None = None, **kw: Any
) -> Booking:
    return Booking(rid, node_id, atoms(node_id, *indexes), start, end, **kw)


_seq = iter(range(1, 1_000_000))


def req(rid: str, count: int = 1, **kw: Any) -> Request:
    """A request; its submit order is the order the test builds them in unless `seq=` says otherwise."""
    kw.setdefault("seq", next(_seq))
    return Request(rid, count=count, **kw)


def outcome(p: Plan, rid: str) -> Outcome:
    return next(o for o in p.outcomes if o.reservation_id == rid)


def placed(p: Plan, rid: str) -> Placement:
    o = outcome(p, rid)
    assert isinstance(o, Placement), o
    return o


def waiting(p: Plan, rid: str) -> Wait:
    o = outcome(p, rid)
    assert isinstance(o, Wait), o
    return o


def indexes(p: Placement | Booking) -> list[int]:
    return [int(a.atom_id.rsplit("gpu", 1)[1]) for a in p.atoms]
