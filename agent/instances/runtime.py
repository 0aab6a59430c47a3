"""The runtime seam: what the `instances` converger asks of a hypervisor, and nothing more.

A runtime lists the domains it knows, bc's (`managed`, with bc's record) and
anyone else's (reported, never touched), and changes bc's own: define (write
or rewrite the record of a stopped domain), start (paused or not), pause,
resume, stop, delete. A start may hand the guest a user-data file. Each call either does what it says or raises
`RuntimeFailure` with one sentence, which fails that instance only. A start
the hypervisor refuses for lack of memory says so with `capacity=True`.

Implementations: `agent.instances.fake.FakeRuntime` (`--fake-hw`, unit tests)
and `agent.instances.qemu.QemuRuntime` (qemu over QMP).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Final, Protocol

# What a runtime observes of a domain (the converger's plan adds ABSENT for one it does not list).
RUNNING: Final = "RUNNING"
PAUSED: Final = "PAUSED"
STOPPED: Final = "STOPPED"
OBSERVED_STATES: tuple[str, ...] = (RUNNING, PAUSED, STOPPED)


@dataclass(frozen=True)
class Domain:
    """One domain a runtime knows. `managed`: bc created it (its record is bc's); else it is only reported."""

    id: str
    state: str
    managed: bool
    vcpus: int = 0
    memory_mib: int = 0
    hugepage_mib: int = 0
    """Its memory is in huge pages of this size (0: normal pages): admission charges it only its overhead."""
    volumes: tuple[str, ...] = ()
    """The persistent volumes its record attaches (open while it runs or is paused)."""


@dataclass(frozen=True)
class NicConfig:
    """One virtio NIC: the tap bc names for it (agent.instances.net, so rules exist before the tap) on its
    bridge, with the guest's MAC."""

    tap: str
    bridge: str
    mac: str


@dataclass(frozen=True)
class VolumeConfig:
    """One persistent volume attached after the root disk: its raw file in the volume store, the serial the
    guest finds it by, read-only or the one writer."""

    id: str
    path: Path
    serial: str
    read_only: bool = False


@dataclass(frozen=True)
class PlacementConfig:
    """Where the guest runs on the host: CPUs (a cpulist), NUMA nodes for its memory, its huge page size
    (0: normal pages), and whether it has a balloon device."""

    cpus: tuple[int, ...] = ()
    mems: tuple[int, ...] = ()
    hugepage_mib: int = 0
    balloon: bool = False


@dataclass(frozen=True)
class DomainConfig:
    """What bc defines a domain with: the spec's instance, its boot files, disks, NICs, GPUs and placement
    resolved on this host."""

    id: str
    vcpus: int
    memory_mib: int
    kernel: Path | None
    initrd: Path | None
    cmdline: str
    allocation_id: str = ""
    disk: Path | None = None
    """The root disk: a qcow2 overlay on a checked tenant image (agent.instances.images), or a restored one."""
    disk_format: str = "qcow2"
    disk_base: Path | None = None
    """The overlay's base image (read-only, shared by every instance of that image): what a confined VMM must
    reach besides its own disk."""
    nics: tuple[NicConfig, ...] = ()
    volumes: tuple[VolumeConfig, ...] = ()
    gpus: tuple[str, ...] = ()
    """PCI addresses of the whole GPUs passed through (VFIO), bound to vfio-pci before the start."""
    placement: PlacementConfig = PlacementConfig()


class RuntimeFailure(Exception):
    """A runtime call that did not do what it says: one sentence for the instance's ERROR message."""

    def __init__(self, message: str, *, capacity: bool = False) -> None:
        super().__init__(message)
        self.capacity = capacity


class NoBalloon(RuntimeFailure):
    """The domain was defined without a balloon device: its memory is never touched."""


@dataclass(frozen=True)
class BalloonReading:
    actual_mib: int
    """What the balloon leaves the guest."""
    used_mib: int | None = None
    """What the guest says it uses (its balloon driver's stats); None until it has said."""


class InstanceRuntime(Protocol):
    name: str

    async def list(self) -> list[Domain]: ...

    async def define(self, config: DomainConfig) -> None: ...

    async def start(self, instance_id: str, *, paused: bool, user_data: Path | None = None) -> None:
        """Start the domain; `user_data`: a file whose content the guest is handed (qemu: fw_cfg
        `opt/bc/user-data`), read at start only."""
        ...

    async def pause(self, instance_id: str) -> None: ...

    async def resume(self, instance_id: str) -> None: ...

    async def stop(self, instance_id: str) -> None: ...

    async def delete(self, instance_id: str) -> None: ...

    async def balloon(self, instance_id: str) -> BalloonReading:
        """The balloon of a running domain (NoBalloon: it has none)."""
        ...

    async def set_balloon(self, instance_id: str, actual_mib: int) -> None:
        """Inflate or deflate the balloon so it leaves the guest `actual_mib` (NoBalloon: it has none)."""
        ...

    async def attach_volume(self, instance_id: str, volume: VolumeConfig) -> None:
        """Attach a volume to a running or paused domain (and to its record, so its next boot has it)."""
        ...

    async def detach_volume(self, instance_id: str, volume_id: str) -> None:
        """Detach a volume from a running or paused domain and its record."""
        ...

    async def resize_volume(self, instance_id: str, volume_id: str, size_bytes: int) -> None:
        """Tell a running or paused domain that a volume it has open grew (its file already has)."""
        ...


def config_record(config: DomainConfig) -> dict[str, object]:
    """The domain's config as JSON-ready data (a runtime's record, e.g. qemu's vm.json)."""
    return {
        "bc": 1,
        "id": config.id,
        "vcpus": config.vcpus,
        "memory_mib": config.memory_mib,
        "kernel": str(config.kernel) if config.kernel is not None else "",
        "initrd": str(config.initrd) if config.initrd is not None else "",
        "cmdline": config.cmdline,
        "allocation_id": config.allocation_id,
        "disk": str(config.disk) if config.disk is not None else "",
        "disk_format": config.disk_format,
        "disk_base": str(config.disk_base) if config.disk_base is not None else "",
        "nics": [{"tap": n.tap, "bridge": n.bridge, "mac": n.mac} for n in config.nics],
        "volumes": [
            {"id": v.id, "path": str(v.path), "serial": v.serial, "read_only": v.read_only} for v in config.volumes
        ],
        "gpus": list(config.gpus),
        "placement": {
            "cpus": list(config.placement.cpus),
            "mems": list(config.placement.mems),
            "hugepage_mib": config.placement.hugepage_mib,
            "balloon": config.placement.balloon,
        },
    }


def record_config(record: dict[str, object]) -> DomainConfig:
    """A record written by `config_record` read back (RuntimeFailure when it is not one: a record is on disk,
    where a VMM that once ran as the guest's user may have written)."""
    try:
        placement = record.get("placement") or {}
        assert isinstance(placement, dict)
        nics = record.get("nics") or []
        volumes = record.get("volumes") or []
        assert isinstance(nics, list) and isinstance(volumes, list)
        gpus = record.get("gpus") or []
        assert isinstance(gpus, list)
        return DomainConfig(
            id=str(record["id"]),
            vcpus=_int(record.get("vcpus")),
            memory_mib=_int(record.get("memory_mib")),
            kernel=Path(str(record["kernel"])) if record.get("kernel") else None,
            initrd=Path(str(record["initrd"])) if record.get("initrd") else None,
            cmdline=str(record.get("cmdline", "")),
            allocation_id=str(record.get("allocation_id", "")),
            disk=Path(str(record["disk"])) if record.get("disk") else None,
            disk_format=str(record.get("disk_format") or "qcow2"),
            disk_base=Path(str(record["disk_base"])) if record.get("disk_base") else None,
            nics=tuple(NicConfig(str(n["tap"]), str(n["bridge"]), str(n["mac"])) for n in nics),
            volumes=tuple(
                VolumeConfig(str(v["id"]), Path(str(v["path"])), str(v["serial"]), bool(v.get("read_only")))
                for v in volumes
            ),
            gpus=tuple(str(g) for g in gpus),
            placement=PlacementConfig(
                tuple(_int(c) for c in placement.get("cpus") or ()),
                tuple(_int(m) for m in placement.get("mems") or ()),
                _int(placement.get("hugepage_mib")),
                bool(placement.get("balloon")),
            ),
        )
    except (KeyError, TypeError, AssertionError, AttributeError):
        raise RuntimeFailure(f"domain {record.get('id')!r}'s record is not bc's") from None


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
