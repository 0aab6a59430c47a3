"""What root accepts of a qemu instance's record before it touches a VFIO group for it. Pure, no I/O.

The record is `<node data>/instances/<id>/vm.json`, written by the node (an
unprivileged user under `bc helper`), so root reads it as a claim to check,
never as an instruction (delivery.md's `ch.vfio` / `ch.launch` rows):

* it is the named instance's (`id`), its VMM user is in bc's range
  (agent.instances.confine.is_vmm_uid), its vCPUs and memory within bounds;
* every path it names is where the node keeps that kind of file: the root
  disk directly in the instance's own directory, the overlay's base image
  `<node data>/images/<64 hex>.<qcow2|raw>`, the kernel and initrd in
  `<node data>/instance-boot/`, volumes `<node data>/volumes/<id>.raw`; no
  `..`, nothing elsewhere;
* its GPUs are PCI addresses (`0000:18:00.0`), each one of **this host's
  GPUs** by what sysfs says of the device itself: a display or 3D controller
  (class `0x0300xx` or `0x0302xx`) of NVIDIA (vendor `0x10de`). Chosen over
  the hardware backend's inventory because the helper runs no NVML, and a
  GPU bound to vfio-pci is gone from NVML's view anyway;
* every device of each GPU's IOMMU group is one of those GPUs, a function of
  one (the same bus and slot: its audio function), or a PCI bridge: root
  never unbinds a NIC or a disk controller that shares a group.

Who may hold a group's device node is agent.instances.vfio_rules (from the
node's owner and the running processes, never the record).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from agent.instances.confine import is_vmm_uid
from agent.instances.net.names import tap_name
from bc.protocol.disk_rules import SERIAL
from bc.protocol.instance_net_rules import IFNAME, MAC, MAX_NICS
from bc.protocol.instance_rules import INSTANCE_ID

PCI_ADDRESS = re.compile(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")
NVIDIA = "0x10de"
GPU_CLASSES = ("0x0300", "0x0302")
BRIDGE_CLASS = "0x0604"
MAX_VCPUS = 1024
MAX_MEMORY_MIB = 16 * 1024 * 1024
MAX_GPUS = 16
IMAGE = re.compile(r"[0-9a-f]{64}\.(qcow2|raw)")
BOOT_FILE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,127}")
VOLUME_ID = re.compile(r"[A-Za-z0-9_-]{1,80}")
VOLUME = re.compile(VOLUME_ID.pattern + r"\.raw")
DISK_FORMATS = ("qcow2", "raw")
BOOT_DIR = "instance-boot"
IMAGES_DIR = "images"
VOLUMES_DIR = "volumes"


class RecordRefused(ValueError):
    """One sentence: why root will not act on this record."""


@dataclass(frozen=True)
class Record:
    """What root took from a record it accepted."""

    instance_id: str
    uid: int
    gpus: tuple[str, ...]
    vcpus: int
    memory_mib: int
    files: tuple[Path, ...]
    """Every file the record names (disk, base image, kernel, initrd, volumes): root checks each is a regular
    file, not a symlink, before it acts."""


@dataclass(frozen=True)
class Device:
    address: str
    pci_class: str
    vendor: str


def _int(doc: Mapping[str, object], key: str, lo: int, hi: int, iid: str) -> int:
    v = doc.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise RecordRefused(f"instance {iid}'s record has {key} {str(v)[:40]!r}, not an integer from {lo} to {hi}")
    return v


def _path_in(raw: object, parent: Path, name: re.Pattern[str], what: str, iid: str) -> Path:
    p = Path(str(raw))
    if not isinstance(raw, str) or p.parent != parent or not name.fullmatch(p.name):
        raise RecordRefused(f"instance {iid}'s record names {what} {str(raw)[:200]!r}, outside {parent}")
    return p


def check_record(doc: object, instance_id: str, node_data: Path) -> Record:
    """The record as root accepts it, or RecordRefused with one sentence."""
    if not INSTANCE_ID.fullmatch(instance_id):
        raise RecordRefused(f"{instance_id[:80]!r} is not an instance id")
    if not isinstance(doc, dict):
        raise RecordRefused(f"instance {instance_id}'s record is not a JSON object")
    if doc.get("id") != instance_id:
        raise RecordRefused(f"the record in instance {instance_id}'s directory is not that instance's")
    uid = doc.get("uid")
    if not is_vmm_uid(uid):
        raise RecordRefused(f"instance {instance_id}'s record has VMM user {str(uid)[:20]!r}, outside bc's range")
    assert isinstance(uid, int)
    vcpus = _int(doc, "vcpus", 1, MAX_VCPUS, instance_id)
    memory = _int(doc, "memory_mib", 16, MAX_MEMORY_MIB, instance_id)
    here = node_data / "instances" / instance_id
    files: list[Path] = []
    if doc.get("disk"):
        files.append(_path_in(doc["disk"], here, BOOT_FILE, "its disk", instance_id))
    if doc.get("disk_base"):
        files.append(_path_in(doc["disk_base"], node_data / IMAGES_DIR, IMAGE, "its base image", instance_id))
    for key in ("kernel", "initrd"):
        if doc.get(key):
            files.append(_path_in(doc[key], node_data / BOOT_DIR, BOOT_FILE, f"its {key}", instance_id))
    volumes = doc.get("volumes") or []
    if not isinstance(volumes, list):
        raise RecordRefused(f"instance {instance_id}'s record has volumes that are not a list")
    for v in volumes:
        raw = v.get("path") if isinstance(v, dict) else None
        files.append(_path_in(raw, node_data / VOLUMES_DIR, VOLUME, "a volume", instance_id))
    _check_argv_fields(doc, volumes, instance_id)
    gpus = doc.get("gpus") or []
    if not isinstance(gpus, list) or len(gpus) > MAX_GPUS:
        raise RecordRefused(f"instance {instance_id}'s record has GPUs that are not a list of at most {MAX_GPUS}")
    for g in gpus:
        if not isinstance(g, str) or not PCI_ADDRESS.fullmatch(g):
            raise RecordRefused(f"instance {instance_id}'s record names GPU {str(g)[:40]!r}, not a PCI address")
    return Record(instance_id, uid, tuple(gpus), vcpus, memory, tuple(files))


def _check_argv_fields(doc: Mapping[str, object], volumes: list[object], instance_id: str) -> None:
    """What else of the record reaches qemu's argv, each in its own alphabet: qemu reads `key=value,…` option
    strings, so a comma in a tap, MAC or serial the node wrote would add options of its own (a tap's
    `script=`) to the VMM root starts. (Numbers reach it as ints only: `record_config`.)"""
    if doc.get("disk_format", "qcow2") not in DISK_FORMATS:
        raise RecordRefused(f"instance {instance_id}'s record has disk format {str(doc.get('disk_format'))[:20]!r}")
    nics = doc.get("nics") or []
    if not isinstance(nics, list) or len(nics) > MAX_NICS:
        raise RecordRefused(f"instance {instance_id}'s record has NICs that are not a list of at most {MAX_NICS}")
    for i, n in enumerate(nics):
        if not isinstance(n, dict) or n.get("tap") != tap_name(instance_id, i):
            raise RecordRefused(f"instance {instance_id}'s record names a tap for NIC {i} that is not its own")
        if not isinstance(n.get("mac"), str) or not MAC.fullmatch(str(n["mac"])):
            raise RecordRefused(f"instance {instance_id}'s record has NIC {i} with a MAC that is not one")
        if not isinstance(n.get("bridge"), str) or not IFNAME.fullmatch(str(n["bridge"])):
            raise RecordRefused(f"instance {instance_id}'s record has NIC {i} on a bridge that is not a name")
    for v in volumes:
        assert isinstance(v, dict)  # _path_in refused anything else
        if not isinstance(v.get("id"), str) or not VOLUME_ID.fullmatch(str(v["id"])):
            raise RecordRefused(f"instance {instance_id}'s record has a volume whose id is not one")
        if not isinstance(v.get("serial"), str) or not SERIAL.fullmatch(str(v["serial"])):
            raise RecordRefused(f"instance {instance_id}'s record has volume {v['id']} with a serial that is not one")


def is_host_gpu(d: Device) -> bool:
    return d.vendor == NVIDIA and d.pci_class.startswith(GPU_CLASSES)


def group_refusal(gpu: str, members: Sequence[Device]) -> str | None:
    """Why root will not move `gpu`'s IOMMU group (whose devices are `members`), or None."""
    by = {d.address: d for d in members}
    if gpu not in by or not is_host_gpu(by[gpu]):
        return f"{gpu} is not one of this host's GPUs (an NVIDIA display or 3D controller)"
    slots = {d.address.rsplit(".", 1)[0] for d in members if is_host_gpu(d)}
    for d in members:
        if is_host_gpu(d) or d.pci_class.startswith(BRIDGE_CLASS) or d.address.rsplit(".", 1)[0] in slots:
            continue
        return f"the IOMMU group of {gpu} also holds {d.address} (class {d.pci_class}), which is not a GPU's"
    return None
