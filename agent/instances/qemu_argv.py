"""qemu's command line for one domain, built from its config, one function per concern.

Pure: a `DomainConfig` (read back from the domain's record) in, argv pieces
out. The base (machine, memory, CPUs, boot, console, QMP, pid file) and the
devices each concern adds: disks, volumes, NICs, GPUs, placement. No path in
it may hold a comma, which qemu's option syntax cannot take (checked once, in
`argv`).
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from agent.instances.runtime import DomainConfig, RuntimeFailure, VolumeConfig
from bc.protocol import cpulist

USER_DATA_FW_CFG = "opt/bc/user-data"
_PCI_ADDRESS = re.compile(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")


def base(config: DomainConfig, binary: str, accel: tuple[str, ...], d: Path) -> list[str]:
    """Machine, memory, CPUs, the direct kernel boot when there is one, console, QMP and pid file."""
    argv = [binary, "-name", f"bc-{config.id}", "-nodefaults", "-no-user-config", "-display", "none"]
    for a in accel:
        argv += ["-accel", a]
    argv += ["-m", f"{config.memory_mib}M", "-smp", str(config.vcpus)]
    if config.kernel is not None:
        argv += ["-kernel", str(config.kernel)]
        if config.initrd is not None:
            argv += ["-initrd", str(config.initrd)]
        argv += ["-append", config.cmdline]
    argv += ["-serial", f"file:{d / 'console.log'}", "-qmp", f"unix:{d / 'qmp.sock'},server=on,wait=off"]
    argv += ["-pidfile", str(d / "qemu.pid"), "-daemonize"]
    return argv


ROOT_NODE = "root"


def disks(config: DomainConfig) -> list[str]:
    """The root disk (a qcow2 overlay, or a restored flat one) as the first virtio disk (vda): a `-device`
    ahead of the volumes', since qemu creates `-drive if=virtio` disks after every `-device` and the guest
    would then find a volume at vda. Direct I/O (cache=none), as before; booted from when no kernel is."""
    if config.disk is None:
        return []
    node = {
        "driver": config.disk_format,
        "node-name": ROOT_NODE,
        "cache": {"direct": True},
        "file": {"driver": "file", "filename": str(config.disk), "aio": "threads"},
    }
    device = f"virtio-blk-pci,id=d{ROOT_NODE},drive={ROOT_NODE}"
    if config.kernel is None:  # a direct kernel boot takes bootindex 0 itself
        device += ",bootindex=0"
    return ["-blockdev", json.dumps(node, separators=(",", ":")), "-device", device]


def volume_node(volume_id: str) -> str:
    """The block node (and, with a `d` in front, the device id) of a volume: qemu's node names are at most
    31 characters and a volume id up to 80, so a short digest of it."""
    return "vol" + hashlib.sha256(volume_id.encode()).hexdigest()[:20]


def volume_blockdev(v: VolumeConfig) -> dict[str, object]:
    """The volume's block node, raw over a file, never probed (the same for a boot and a live attach)."""
    node: dict[str, object] = {
        "driver": "raw",
        "node-name": volume_node(v.id),
        "file": {"driver": "file", "filename": str(v.path), "aio": "threads"},
    }
    if v.read_only:
        node["read-only"] = True
    return node


def volume_device(v: VolumeConfig) -> dict[str, object]:
    """The guest's virtio disk of the volume, found at /dev/disk/by-id/virtio-<serial>."""
    return {"driver": "virtio-blk-pci", "id": "d" + volume_node(v.id), "drive": volume_node(v.id), "serial": v.serial}


def volumes(config: DomainConfig) -> list[str]:
    """Persistent volumes after the root disk, raw, each with its serial."""
    out: list[str] = []
    for v in config.volumes:
        out += ["-blockdev", json.dumps(volume_blockdev(v), separators=(",", ":"))]
        d = volume_device(v)
        out += ["-device", f"{d['driver']},id={d['id']},drive={d['drive']},serial={d['serial']}"]
    return out


def nics(config: DomainConfig) -> list[str]:
    """Virtio NICs on the taps bc named (agent.instances.net), which bc created, bridged and brought up:
    qemu runs no script on them."""
    out: list[str] = []
    for i, nic in enumerate(config.nics):
        out += ["-netdev", f"tap,id=n{i},ifname={nic.tap},script=no,downscript=no"]
        out += ["-device", f"virtio-net-pci,netdev=n{i},mac={nic.mac}"]
    return out


def gpus(config: DomainConfig) -> list[str]:
    """Whole GPUs passed through with VFIO, by the sysfs address bc bound to vfio-pci before the start
    (agent.instances.passthrough). The rest of each IOMMU group (the audio function) is on vfio-pci too,
    which VFIO needs, but only the GPU is handed to the guest."""
    out: list[str] = []
    for address in config.gpus:
        if not _PCI_ADDRESS.fullmatch(address):
            raise RuntimeFailure(f"domain {config.id}'s GPU address {address[:40]!r} is not a PCI address")
        out += ["-device", f"vfio-pci,host={address}"]
    return out


def placement(config: DomainConfig) -> list[str]:
    """The guest's memory as one backend: a memfd of huge pages of its size (no hugetlbfs mount to share with
    other users, and preallocated, so a start that cannot have its pages fails at once rather than the guest
    later) or plain RAM, bound strictly to its NUMA nodes when it names any; and the balloon device (free page
    reporting: the guest hands back what it frees), which the host sizes (agent.instances.balloon)."""
    p = config.placement
    out: list[str] = []
    nodes = f",host-nodes={cpulist.render(p.mems)},policy=bind" if p.mems else ""
    if p.hugepage_mib:
        size = "1G" if p.hugepage_mib == 1024 else f"{p.hugepage_mib}M"
        backend = f"memory-backend-memfd,id=bc-mem,size={config.memory_mib}M,hugetlb=on,hugetlbsize={size},prealloc=on"
        out += ["-object", backend + nodes, "-machine", "memory-backend=bc-mem"]
    elif p.mems:
        out += ["-object", f"memory-backend-ram,id=bc-mem,size={config.memory_mib}M" + nodes]
        out += ["-machine", "memory-backend=bc-mem"]
    if p.balloon:
        out += ["-device", "virtio-balloon-pci,id=bc-balloon,free-page-reporting=on"]
    return out


def cpu_affinity(config: DomainConfig) -> list[str]:
    """A prefix that starts qemu on its CPUs (`taskset`): every thread it makes, vCPUs included, inherits
    them, with no window in which one runs elsewhere."""
    return ["taskset", "-c", cpulist.render(config.placement.cpus)] if config.placement.cpus else []


def user_data(path: Path | None) -> list[str]:
    """The guest reads /sys/firmware/qemu_fw_cfg/by_name/opt/bc/user-data/raw."""
    return ["-fw_cfg", f"name={USER_DATA_FW_CFG},file={path}"] if path is not None else []


def argv(
    config: DomainConfig, binary: str, accel: tuple[str, ...], d: Path, *, paused: bool, user_data_file: Path | None
) -> list[str]:
    out = cpu_affinity(config) + base(config, binary, accel, d)
    out += disks(config) + volumes(config) + nics(config) + gpus(config) + placement(config)
    out += user_data(user_data_file)
    if paused:
        out.append("-S")
    paths = [
        str(d),
        str(config.kernel or ""),
        str(config.initrd or ""),
        str(config.disk or ""),
        str(user_data_file or ""),
    ]
    paths += [str(v.path) for v in config.volumes]
    if any("," in p for p in paths):
        raise RuntimeFailure(f"domain {config.id}'s paths hold a comma, which qemu's options cannot take")
    return out
