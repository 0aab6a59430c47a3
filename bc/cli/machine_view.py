"""The bare machine's part of `bc nodes show`: the disks, NICs and PCI GPUs a ramdisk reports
(docs/metal-ramdisk.md). Every string in these tables came from the machine (a disk's model and serial,
a NIC's name): they go out through the tables' cells and the escaping writer like every other."""

from __future__ import annotations

from bc.cli.output import Lines, lines
from bc.cli.render import format_bytes, render_table
from bc.protocol.pb import common_pb2


def render_machine(inv: common_pb2.Inventory) -> list[Lines]:
    """DISKS, NICS and PCI GPUS tables for the ones the inventory has; none for a node's inventory."""
    out: list[Lines] = []
    if inv.disks:
        disk_rows: list[tuple[object, ...]] = [
            (
                d.name,
                format_bytes(d.size_bytes),
                d.transport or "-",
                "hdd" if d.rotational else "ssd",
                format_bytes(d.discard_max_bytes) if d.discard_max_bytes else "no",
                d.model,
                d.serial,
                ", ".join(d.mounted) or "-",
            )
            for d in inv.disks
        ]
        headers = ("DISK", "SIZE", "BUS", "MEDIA", "DISCARD", "MODEL", "SERIAL", "IN USE")
        out.append(lines(f"DISKS  {len(inv.disks)}", render_table(headers, disk_rows)))
    if inv.nics:
        nic_rows: list[tuple[object, ...]] = [
            (n.name, n.mac, f"{n.speed_mbps} Mb/s" if n.speed_mbps else "-", n.operstate, n.pci_bus_id)
            for n in inv.nics
        ]
        out.append(lines(f"NICS  {len(inv.nics)}", render_table(("NIC", "MAC", "SPEED", "STATE", "PCI"), nic_rows)))
    if inv.pci_gpus:
        gpu_rows: list[tuple[object, ...]] = [
            (g.bus_id, f"{g.vendor}:{g.device}", g.driver or "none", g.numa_node if g.numa_node >= 0 else "-")
            for g in inv.pci_gpus
        ]
        out.append(lines(f"PCI GPUS  {len(inv.pci_gpus)}", render_table(("PCI", "ID", "DRIVER", "NUMA"), gpu_rows)))
    return out
