"""`bc nodes show` of a ramdisk: its disks, NICs and PCI GPUs under the inventory, in tables."""

from __future__ import annotations

from bc.cli.admin_cmds import render_inventory
from bc.protocol.pb import common_pb2


def test_a_ramdisk_inventory_shows_disks_nics_and_pci_gpus() -> None:
    inv = common_pb2.Inventory(
        hostname="pxe-17",
        source="fake:hgx-h100-8",
        disks=[
            common_pb2.Disk(name="nvme0n1", size_bytes=4 << 40, transport="nvme", discard_max_bytes=2 << 30),
            common_pb2.Disk(name="sda", size_bytes=1 << 40, rotational=True, model="ST1000", mounted=["/", "[swap]"]),
        ],
        nics=[common_pb2.Nic(name="eno1", mac="0c:42:a1:00:00:01", speed_mbps=25000, operstate="up")],
        pci_gpus=[common_pb2.PciDevice(bus_id="0000:17:00.0", vendor="0x10de", device="0x2330", numa_node=-1)],
    )
    text = "\n".join(render_inventory(inv))
    assert "INVENTORY  host pxe-17, source fake:hgx-h100-8, 0 GPUs" in text
    assert "DISKS  2" in text and "NICS  1" in text and "PCI GPUS  1" in text
    [sda] = [line for line in text.splitlines() if line.startswith("sda ")]
    assert "1.0 TiB" in sda and "hdd" in sda and "ST1000" in sda and sda.endswith("/, [swap]")
    [nvme] = [line for line in text.splitlines() if line.startswith("nvme0n1 ")]
    assert "2.0 GiB" in nvme and "ssd" in nvme and nvme.endswith("-")
    [gpu] = [line for line in text.splitlines() if line.startswith("0000:17:00.0")]
    assert "0x10de:0x2330" in gpu and "none" in gpu


def test_a_node_inventory_has_no_machine_tables() -> None:
    text = "\n".join(render_inventory(common_pb2.Inventory(hostname="n1", source="nvml")))
    assert "DISKS" not in text and "NICS" not in text
