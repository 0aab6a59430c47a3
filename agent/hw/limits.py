"""A hold's host resources: its limits, its cgroup-v2 slice, and whether the host can take them.

Pure functions only (no I/O): the devices converger decides with them, and the
slice seam (`agent.hw.slices`) applies what they say.

* `Limits` is `DeviceAssignment.limits` as the agent keeps it; a hold whose
  limits are all zero has none, and gets no slice.
* `slice_name` is the hold's slice, `bc-alloc-<allocation id>.slice`, and
  `slice_properties` the systemd properties it is made with: `CPUQuota` from
  `cpu_millis` (whole percents of one CPU, rounded up), `MemoryMax` from
  `memory_bytes` with `MemoryHigh` at 90% of it, `AllowedCPUs` and
  `AllowedMemoryNodes` from `cpus` and `mems`. Huge pages have no systemd
  property; the real seam writes `hugetlb.1GB.max` and `hugetlb.2MB.max`.
* `admit` is host admission (reference "Device assignments", host admission
  of holds): a new hold whose limits carry memory or 1 GiB huge pages fits
  only in what the host has left, `MemTotal` less the huge page pool less
  1 GiB of headroom, less what the holds already bound have booked.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass

from bc.protocol.pb import common_pb2, spec_pb2

GIB = 1 << 30
MIB = 1 << 20
HEADROOM_BYTES = GIB
"""What host admission leaves to the host itself."""
SLICE_PREFIX = "bc-alloc-"
SLICE_SUFFIX = ".slice"

_CPULIST = re.compile(r"\d{1,5}(-\d{1,5})?(,\d{1,5}(-\d{1,5})?)*")


class InvalidLimits(ValueError):
    """Limits no host could apply (negative numbers, a cpulist that is not one)."""


@dataclass(frozen=True)
class Limits:
    cpu_millis: int = 0
    memory_bytes: int = 0
    hugepages_1gi: int = 0
    hugepages_2mi: int = 0
    cpus: str = ""
    mems: str = ""

    @classmethod
    def from_proto(cls, pb: spec_pb2.ResourceLimits) -> Limits:
        return cls(
            cpu_millis=pb.cpu_millis,
            memory_bytes=pb.memory_bytes,
            hugepages_1gi=pb.hugepages_1gi,
            hugepages_2mi=pb.hugepages_2mi,
            cpus=pb.cpus,
            mems=pb.mems,
        )

    @property
    def empty(self) -> bool:
        return self == Limits()

    def check(self) -> None:
        """Raise InvalidLimits unless every field is one a slice can carry."""
        for name in ("cpu_millis", "memory_bytes", "hugepages_1gi", "hugepages_2mi"):
            if getattr(self, name) < 0:
                raise InvalidLimits(f"limits.{name} is negative")
        for name in ("cpus", "mems"):
            value = getattr(self, name)
            if value and not _CPULIST.fullmatch(value):
                raise InvalidLimits(f"limits.{name} {value!r} is not a cpulist (e.g. 0-3,8)")

    def annotation(self) -> str:
        """The limits as the CDI annotation `bc.dev/limits` (compact JSON of the fields set), read back by
        `from_annotation`: the CDI file says what a hold booked, so admission counts it after a restart."""
        return json.dumps({k: v for k, v in asdict(self).items() if v}, sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_annotation(cls, text: str) -> Limits:
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError("bc.dev/limits is not a JSON object")
        return cls(
            cpu_millis=int(data.get("cpu_millis", 0)),
            memory_bytes=int(data.get("memory_bytes", 0)),
            hugepages_1gi=int(data.get("hugepages_1gi", 0)),
            hugepages_2mi=int(data.get("hugepages_2mi", 0)),
            cpus=str(data.get("cpus", "")),
            mems=str(data.get("mems", "")),
        )


NO_LIMITS = Limits()


def slice_name(allocation_id: str) -> str:
    return f"{SLICE_PREFIX}{allocation_id}{SLICE_SUFFIX}"


def allocation_of_slice(name: str) -> str | None:
    """The allocation a hold slice's name carries, or None when it is not a hold slice's name."""
    if name.startswith(SLICE_PREFIX) and name.endswith(SLICE_SUFFIX) and len(name) > len(SLICE_PREFIX + SLICE_SUFFIX):
        return name[len(SLICE_PREFIX) : -len(SLICE_SUFFIX)]
    return None


def slice_properties(limits: Limits) -> dict[str, str]:
    """The systemd properties of the hold's slice (`systemctl set-property --runtime NAME K=V…`)."""
    props: dict[str, str] = {}
    if limits.cpu_millis:
        props["CPUQuota"] = f"{math.ceil(limits.cpu_millis / 10)}%"
    if limits.memory_bytes:
        props["MemoryMax"] = str(limits.memory_bytes)
        props["MemoryHigh"] = str(limits.memory_bytes * 9 // 10)
    if limits.cpus:
        props["AllowedCPUs"] = limits.cpus
    if limits.mems:
        props["AllowedMemoryNodes"] = limits.mems
    return props


def hugetlb_limits(limits: Limits) -> dict[str, int]:
    """cgroupfs `hugetlb.<size>.max` values in bytes (systemd has no property for them)."""
    out: dict[str, int] = {}
    if limits.hugepages_1gi:
        out["hugetlb.1GB.max"] = limits.hugepages_1gi * GIB
    if limits.hugepages_2mi:
        out["hugetlb.2MB.max"] = limits.hugepages_2mi * 2 * MIB
    return out


def cgroup_path(name: str) -> str:
    """Where systemd puts a slice in the cgroup tree: each `-` is a level (`a-b.slice` is under `a.slice`)."""
    stem = name.removesuffix(SLICE_SUFFIX)
    parts = stem.split("-")
    return "/".join("-".join(parts[: i + 1]) + SLICE_SUFFIX for i in range(len(parts)))


# Host admission.


@dataclass(frozen=True)
class HostMemory:
    """What admission counts on: `MemTotal` and the 1 GiB huge page pool (None: the pool is unknown)."""

    total_bytes: int
    hugepages_1g: int | None


def host_memory(inventory: common_pb2.Inventory) -> HostMemory | None:
    """The host's memory from the inventory, or None when it could not be read (no admission, a warning)."""
    if inventory.memory_bytes <= 0:
        return None
    pool = sum(n.hugepages_1g for n in inventory.numa_nodes) if inventory.numa_nodes else None
    return HostMemory(inventory.memory_bytes, pool)


def admit(new: Limits, bound: Iterable[Limits], host: HostMemory) -> str | None:
    """None when `new` fits next to the holds already `bound`, else why not (the AllocationFailed message).

    Only memory and 1 GiB huge pages are admitted; a hold that books neither always fits.
    """
    if not new.memory_bytes and not new.hugepages_1gi:
        return None
    held = list(bound)
    pool = host.hugepages_1g or 0
    if new.memory_bytes:
        left = host.total_bytes - pool * GIB - HEADROOM_BYTES - sum(b.memory_bytes for b in held)
        if new.memory_bytes > left:
            return f"{_mib(new.memory_bytes)} MiB of memory needed, {_mib(max(left, 0))} MiB left on this host"
    if new.hugepages_1gi and host.hugepages_1g is not None:
        pages_left = host.hugepages_1g - sum(b.hugepages_1gi for b in held)
        if new.hugepages_1gi > pages_left:
            return f"{new.hugepages_1gi} 1 GiB huge pages needed, {max(pages_left, 0)} left on this host"
    return None


def _mib(n: int) -> int:
    return n // MIB
