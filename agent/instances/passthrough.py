"""GPU passthrough for the `instances` converger: check, bind to vfio-pci, record, hand back.

Before a start the converger asks `resolve` for the instance's GPUs' PCI
addresses (the rules of agent.instances.gpu_rules against the spec's devices
section and the node's bookings; a RuntimeFailure fails that instance), then
`attach`: the record `<data-dir>/instance-gpus/<instance>.json` is written
first (the GPUs, each moved device and the driver it had), then every IOMMU
group moves to vfio-pci (agent.instances.vfio), so a crash in between still
leaves what to hand back. A stop or delete calls `detach`, which gives a
confined VMM's group nodes (`/dev/vfio/<group>`) back to root, hands each
device back to its driver and removes the record; at the end of every pass
`keep_only` hands back the GPUs of every instance no longer running or paused
(a guest that powered off, a host reboot, a start that failed).

The records are also what `gpu.reset` reads, fresh, to refuse a GPU passed
through to an instance (`passed_through`, agent.kinds.holds): while a record
exists the GPU belongs to a VM.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.hw import cdi
from agent.instances import gpu_rules, vfio
from agent.instances.confine import running_vmm_uids
from agent.instances.runtime import RuntimeFailure
from agent.offload import Offload
from bc.protocol.pb import common_pb2, spec_pb2

log = logging.getLogger(__name__)

RECORDS_DIR = "instance-gpus"
SUFFIX = ".json"


@dataclass(frozen=True)
class Attached:
    """One instance's record: its GPUs (UUIDs) and every device moved to vfio-pci, with its driver before."""

    instance_id: str
    gpus: tuple[str, ...]
    moved: tuple[vfio.Moved, ...]


def _record_path(records: Path, instance_id: str) -> Path:
    return records / f"{instance_id}{SUFFIX}"


def read_records(records: Path) -> dict[str, Attached]:
    """Every record, by instance (blocking). A file that is not one is skipped with a warning."""
    out: dict[str, Attached] = {}
    try:
        names = sorted(os.listdir(records))
    except FileNotFoundError:
        return out
    for name in names:
        if not name.endswith(SUFFIX) or name.startswith("."):
            continue
        try:
            doc = json.loads((records / name).read_text("utf-8"))
            a = Attached(
                str(doc["instance"]),
                tuple(str(g) for g in doc["gpus"]),
                tuple(vfio.Moved(str(m["address"]), str(m["driver"])) for m in doc["moved"]),
            )
        except (OSError, ValueError, KeyError, TypeError) as e:
            log.warning("event=instance-gpus.unreadable file=%s error=%r", name, str(e))
            continue
        out[a.instance_id] = a
    return out


def passed_through(records: Path, uuids: Collection[str] | None = None) -> dict[str, str]:
    """The GPUs passed through to an instance now (every one when `uuids` is None): uuid -> instance (blocking)."""
    out: dict[str, str] = {}
    for a in read_records(records).values():
        for g in a.gpus:
            if uuids is None or g in uuids:
                out[g] = a.instance_id
    return out


def _write_record(records: Path, a: Attached) -> None:
    doc: dict[str, Any] = {
        "bc": 1,
        "instance": a.instance_id,
        "gpus": list(a.gpus),
        "moved": [{"address": m.address, "driver": m.driver} for m in a.moved],
    }
    records.mkdir(mode=0o700, parents=True, exist_ok=True)
    cdi.atomic_write(_record_path(records, a.instance_id), (json.dumps(doc, indent=2) + "\n").encode(), mode=0o600)


def _attach(
    host: vfio.VfioHost,
    records: Path,
    instance_id: str,
    gpus: tuple[str, ...],
    addresses: list[str],
    binds: bool = True,
) -> None:
    """Blocking: record, bind every group, record what moved (with the drivers a first attach saw). `binds`
    False: the record only (root binds them at the VMM's launch, under `bc helper`)."""
    before = read_records(records)
    for other in before.values():
        taken = set(other.gpus) & set(gpus)
        if other.instance_id != instance_id and taken:
            raise vfio.VfioError(f"GPU {min(taken)} is passed through to instance {other.instance_id}")
    old = before.get(instance_id)
    known = {m.address: m.driver for m in old.moved} if old is not None else {}
    planned = [vfio.Moved(a, known.get(a, host.driver(a))) for addr in addresses for a in vfio.endpoints(host, addr)]
    _write_record(records, Attached(instance_id, gpus, tuple(planned)))
    if not binds:
        return
    moved: list[vfio.Moved] = []
    try:
        for addr in addresses:
            moved += vfio.bind_group(host, addr)
    except vfio.VfioError:
        vfio.release(host, planned)
        cdi.remove_file(_record_path(records, instance_id))
        raise
    drivers = {m.address: m.driver for m in planned}
    final = tuple(vfio.Moved(m.address, drivers.get(m.address, m.driver)) for m in moved)
    _write_record(records, Attached(instance_id, gpus, final))


def _detach(host: vfio.VfioHost, records: Path, instance_id: str, running: Callable[[], frozenset[int]]) -> list[str]:
    a = read_records(records).get(instance_id)
    if a is None:
        return []
    # a confined VMM's group nodes go back to root first (a VMM found gone never stopped through its runtime);
    # the node's own owner decides, so a group some running VMM's user holds stays its
    vfio.give_back(host, [m.address for m in a.moved], None, running())
    stuck = vfio.release(host, list(a.moved))
    cdi.remove_file(_record_path(records, instance_id))
    return stuck


class GpuPassthrough:
    """The converger's passthrough: `resolve` before a define, `attach` before a start, `detach` after a stop."""

    def __init__(
        self,
        host: vfio.VfioHost,
        records: Path,
        offload: Offload,
        inventory: Callable[[], Awaitable[common_pb2.Inventory]],
        devices: Callable[[], spec_pb2.DevicesSection],
        booked: Callable[[], Awaitable[Mapping[str, frozenset[str]]]],
        running_uids: Callable[[], frozenset[int]] = running_vmm_uids,
        release: Callable[[str], Awaitable[None]] | None = None,
    ) -> None:
        self.running_uids = running_uids
        self.release = release
        """Under `bc helper`: root binds at the VMM's launch and this hands an instance's devices back (vm.unvfio);
        this agent then writes only the records."""
        self.host = host
        self.records = records
        self.offload = offload
        self.inventory = inventory
        self.devices = devices
        self.booked = booked

    async def resolve(self, inst: spec_pb2.Instance) -> tuple[str, ...]:
        """The sysfs addresses of the instance's GPUs, in order, or RuntimeFailure naming the GPU at fault."""
        if not inst.gpus:
            return ()
        try:
            gpu_rules.check(inst, list(self.devices().assignments), await self.booked())
            return tuple(vfio.sysfs_address(b) for b in gpu_rules.bus_ids(list(inst.gpus), await self.inventory()))
        except (gpu_rules.GpuRuleError, vfio.VfioError) as e:
            raise RuntimeFailure(str(e)) from None

    async def attach(self, instance_id: str, gpus: tuple[str, ...], addresses: tuple[str, ...]) -> None:
        if not gpus:
            return
        try:
            await self.offload(
                _attach, self.host, self.records, instance_id, gpus, list(addresses), self.release is None
            )
        except (vfio.VfioError, OSError) as e:
            raise RuntimeFailure(f"VFIO: {e}") from None
        log.info("event=instance.gpus-attached instance=%s gpus=%s", instance_id, ",".join(gpus))

    async def detach(self, instance_id: str) -> None:
        """Hand the instance's GPUs back (nothing when it has none). A device that stays put is logged: the
        record goes either way, so a reset is no longer refused for a VM that is gone."""
        if self.release is not None:
            await self._detach_through(self.release, instance_id)
            return
        try:
            stuck = await self.offload(_detach, self.host, self.records, instance_id, self.running_uids)
        except OSError as e:
            log.warning("event=instance.gpus-detach-failed instance=%s error=%r", instance_id, str(e))
            return
        if stuck:
            log.warning("event=instance.gpus-not-handed-back instance=%s devices=%s", instance_id, ",".join(stuck))

    async def _detach_through(self, release: Callable[[str], Awaitable[None]], instance_id: str) -> None:
        if instance_id not in await self.attached():
            return
        try:
            await release(instance_id)
        except RuntimeFailure as e:  # e.g. its directory is gone: the delete handed them back already
            log.warning("event=instance.gpus-not-handed-back instance=%s error=%r", instance_id, str(e))
        await self.offload(cdi.remove_file, _record_path(self.records, instance_id))

    async def attached(self) -> dict[str, Attached]:
        return await self.offload(read_records, self.records)

    async def keep_only(self, live: Collection[str]) -> None:
        """Hand back every instance's GPUs but the running and paused ones'."""
        for iid in sorted(set(await self.attached()) - set(live)):
            await self.detach(iid)
            log.info("event=instance.gpus-detached instance=%s reason=not-running", iid)
