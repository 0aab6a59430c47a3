"""What `bc nodes show` says of a node's capacity: per device class what it offers, what is booked now,
what is free now and what is booked for later windows; and its host resources against what holds booked.
Pure over the inventory and the node's unreleased bookings, with the same atom rules as placement."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bc.control.capacity import atoms as capacity
from bc.protocol.atoms import DEVICE_CLASSES, parse_atom
from bc.protocol.pb import common_pb2


@dataclass(frozen=True)
class ClassCapacity:
    device_class: str
    offered: int
    booked_now: int
    free_now: int
    booked_later: int  # atoms of bookings whose window has not started yet


@dataclass(frozen=True)
class HostCapacity:
    cpus: int
    memory_bytes: int
    hugepages_1g: int
    cpus_booked: int
    memory_booked: int
    hugepages_1g_booked: int


def _now(b: Mapping[str, Any], now_ms: int) -> bool:
    start, end = b["start_ms"], b["end_ms"]
    return (start is None or int(start) <= now_ms) and (end is None or int(end) > now_ms)


def node_capacity(
    inventory: common_pb2.Inventory, bookings: Sequence[Mapping[str, Any]], now_ms: int
) -> tuple[list[ClassCapacity], HostCapacity]:
    now = [b for b in bookings if _now(b, now_ms)]
    later = [b for b in bookings if b["start_ms"] is not None and int(b["start_ms"]) > now_ms]
    booked_now = [parse_atom(str(b["device_class"]), str(b["atom_id"])) for b in now]
    classes: list[ClassCapacity] = []
    for cls in DEVICE_CLASSES:
        offered = capacity.offered_atoms(inventory, cls)
        if not offered:
            continue
        free = capacity.free_among(offered, booked_now)
        classes.append(
            ClassCapacity(
                device_class=cls,
                offered=len(offered),
                booked_now=sum(1 for b in now if b["device_class"] == cls),
                free_now=len(free),
                booked_later=sum(1 for b in later if b["device_class"] == cls),
            )
        )
    holds = {str(b["reservation_id"]): b for b in now}  # host resources are per reservation, not per atom
    host = HostCapacity(
        cpus=inventory.cpus,
        memory_bytes=inventory.memory_bytes,
        hugepages_1g=sum(n.hugepages_1g for n in inventory.numa_nodes),
        cpus_booked=sum(int(b["cpus"] or 0) for b in holds.values()),
        memory_booked=sum(int(b["memory_bytes"] or 0) for b in holds.values()),
        hugepages_1g_booked=sum(int(b["hugepages_1g"] or 0) for b in holds.values()),
    )
    return classes, host
