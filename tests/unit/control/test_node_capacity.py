"""`bc nodes show`'s capacity: offered, booked now, free now, booked for later windows, host resources."""

from __future__ import annotations

from agent.hw.fake import FakeHardware
from bc.control.capacity.node_capacity import node_capacity


def booking(res: str, atom: str, start: int | None, end: int | None, **host: int) -> dict[str, object]:
    return {
        "reservation_id": res,
        "device_class": "gpu",
        "atom_id": atom,
        "start_ms": start,
        "end_ms": end,
        "cpus": host.get("cpus", 0),
        "memory_bytes": host.get("memory_bytes", 0),
        "hugepages_1g": host.get("hugepages_1g", 0),
    }


def test_counts_what_is_booked_now_and_later_and_host_resources_once_per_hold() -> None:
    inv = FakeHardware("hgx-h100-8", "n1").inventory()
    u = [g.uuid for g in inv.gpus]
    rows = [
        booking("r1", u[0], 0, None, cpus=16, memory_bytes=1 << 30),
        booking("r1", u[1], 0, None, cpus=16, memory_bytes=1 << 30),  # the same hold: counted once
        booking("r2", u[2], 5_000, 9_000),  # tonight's window
        booking("r3", u[3], 0, 1_000),  # over already (not yet swept)
    ]
    (gpu,), host = node_capacity(inv, rows, now_ms=2_000)
    assert (gpu.device_class, gpu.offered, gpu.booked_now, gpu.free_now, gpu.booked_later) == ("gpu", 8, 2, 6, 1)
    assert (host.cpus, host.cpus_booked, host.memory_booked) == (224, 16, 1 << 30)
    assert host.hugepages_1g == 128 and host.hugepages_1g_booked == 0


def test_slot_and_mig_classes_show_only_where_offered() -> None:
    classes, _ = node_capacity(FakeHardware("mig-a100-4", "n1").inventory(), [], now_ms=0)
    assert {c.device_class for c in classes} == {"gpu", "gpu.mig"}
    classes, _ = node_capacity(FakeHardware("l4-slots-4", "n1").inventory(), [], now_ms=0)
    assert {c.device_class: c.offered for c in classes} == {"gpu": 4, "gpu.slot": 16}
