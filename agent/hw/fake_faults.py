"""Faults injected into a fake node, for tests and demos: `bc node --fake-hw P --fake-fault xid79:GPU-…`.

A fault is `KIND:GPU` (the GPU's uuid or index) or, for the host, `KIND`:

| kind            | what the fake then reads                           | condition                         |
| --------------- | -------------------------------------------------- | --------------------------------- |
| `xid<N>`        | one XID N event (delivered once, like NVML's)      | `GpuHealthy/<uuid>` False `Xid<N>`|
| `ecc`           | 1 uncorrectable volatile ECC error                 | False `EccUncorrectable`          |
| `remap-pending` | a pending row remap                                | False `RowRemapPending`           |
| `remap-failed`  | a failed row remap                                 | False `RowRemapFailed`            |
| `throttle`      | the hw-slowdown throttle reason                    | False `Throttled`                 |
| `offbus`        | the GPU has fallen off the bus                     | False `FallenOffBus`              |
| `memory-low`    | 1 % of the host's memory available                 | `HostResourcesExhausted` `MemoryLow` |
| `disk-low`      | 16 MiB free under the data dir                     | `HostResourcesExhausted` `DiskLow`|

Faults come from the `--fake-fault` flags (for the process's life) and from
the file `<data-dir>/fake-faults` (one fault a line, `#` comments), which the
source re-reads whenever it changes: a test writes the file to raise a fault
and rewrites it to clear one. An XID is an event, not a state: it is
delivered once when it appears (a flag's at start, a line's when it is added;
remove the line and add it again for a second event), and the agent keeps it
until a `gpu.reset` after which the GPU reads healthy. The other faults hold
while they are listed. A line that does not parse is logged and skipped.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from agent.health.readings import GpuReading, HealthReading, HostReading
from agent.hw.base import HardwareBackend

log = logging.getLogger(__name__)

FAULTS_FILE = "fake-faults"
GPU_KINDS = frozenset({"ecc", "remap-pending", "remap-failed", "throttle", "offbus"})
HOST_KINDS = frozenset({"memory-low", "disk-low"})
_XID = re.compile(r"xid(\d{1,4})")
FAKE_DISK_BYTES = 512 << 30
LOW_DISK_BYTES = 16 << 20


class BadFault(ValueError):
    """A fault spec that does not parse; the message is the sentence an operator reads."""


@dataclass(frozen=True)
class Fault:
    kind: str  # xid79, ecc, ..., memory-low
    gpu: str = ""  # a uuid or an index; empty for a host fault

    @property
    def xid(self) -> int | None:
        m = _XID.fullmatch(self.kind)
        return int(m.group(1)) if m else None


def parse_fault(text: str) -> Fault:
    kind, sep, gpu = text.strip().partition(":")
    kind = kind.strip().lower()
    gpu = gpu.strip()
    if kind in HOST_KINDS:
        if sep:
            raise BadFault(f"fault {text!r}: {kind} is a host fault and names no GPU")
        return Fault(kind)
    if kind in GPU_KINDS or _XID.fullmatch(kind):
        if not gpu:
            raise BadFault(f"fault {text!r} names no GPU: write {kind}:<GPU uuid or index>")
        if not (gpu.isdigit() or re.fullmatch(r"GPU-[0-9a-fA-F-]{8,64}", gpu)):
            raise BadFault(f"fault {text!r}: {gpu!r} is neither a GPU uuid (GPU-…) nor an index")
        return Fault(kind, gpu)
    known = ", ".join(["xid<N>", *sorted(GPU_KINDS), *sorted(HOST_KINDS)])
    raise BadFault(f"unknown fault kind {kind!r} in {text!r}; kinds are {known}")


def parse_faults(lines: Iterable[str]) -> list[Fault]:
    return [parse_fault(x) for x in lines]


class FakeHealthSource:
    """A HealthSource over the fake backend: its seeded counters, with the injected faults on top."""

    def __init__(self, hw: HardwareBackend, flags: Sequence[Fault] = (), faults_file: Path | None = None) -> None:
        self.hw = hw
        self.flags = list(flags)
        self.faults_file = faults_file
        self._file_text = ""
        self._file_faults: list[Fault] = []
        self._flags_sent = False
        self._present: set[str] = set()  # the file's XIDs (uuid/xid) at the last read

    def _read_file(self) -> list[Fault]:
        """The file's faults, parsed again whenever its text changed (it is small: read whole each pass)."""
        if self.faults_file is None:
            return []
        try:
            text = self.faults_file.read_text("utf-8")
        except FileNotFoundError:
            text = ""
        if text != self._file_text:
            self._file_text = text
            faults = []
            for n, line in enumerate(text.splitlines(), 1):
                line = line.split("#", 1)[0].strip()
                if not line:
                    continue
                try:
                    faults.append(parse_fault(line))
                except BadFault as e:
                    log.warning("event=fake.fault-skipped file=%s line=%d why=%r", self.faults_file, n, str(e))
            self._file_faults = faults
            log.info(
                "event=fake.faults-read file=%s faults=%s", self.faults_file, [f"{f.kind}:{f.gpu}" for f in faults]
            )
        return self._file_faults

    def read(self) -> HealthReading:
        inv = self.hw.inventory()
        diag = self.hw.diag([])
        uuid_of = {str(g.index): g.uuid for g in inv.gpus} | {g.uuid: g.uuid for g in inv.gpus}
        # A flag's XID is one event for the process (the first read); a line's, one each time it appears.
        tagged = [(True, f) for f in self.flags if f.xid is None or not self._flags_sent]
        tagged += [(False, f) for f in self._read_file()]
        self._flags_sent = True
        per_gpu: dict[str, set[str]] = {}
        host: set[str] = set()
        new_xids: dict[str, list[int]] = {}
        present: set[str] = set()
        for from_flag, f in tagged:
            if not f.gpu:
                host.add(f.kind)
                continue
            uuid = uuid_of.get(f.gpu)
            if uuid is None:
                log.warning("event=fake.fault-unknown-gpu fault=%s:%s", f.kind, f.gpu)
                continue
            x = f.xid
            if x is None:
                per_gpu.setdefault(uuid, set()).add(f.kind)
            elif from_flag:
                new_xids.setdefault(uuid, []).append(x)
            else:
                present.add(f"{uuid}/{x}")
                if f"{uuid}/{x}" not in self._present:
                    new_xids.setdefault(uuid, []).append(x)
        self._present = present
        gpus = []
        for g in inv.gpus:
            d = diag.get(g.uuid, {})
            kinds = per_gpu.get(g.uuid, set())
            ecc = d.get("ecc") or {}
            vol, agg = ecc.get("volatile") or {}, ecc.get("aggregate") or {}
            remap = d.get("row_remapping") or {}
            extra_ecc = 1 if "ecc" in kinds else 0
            util = (int(g.uuid[4:8], 16) % 70) + 10.0
            gpus.append(
                GpuReading(
                    uuid=g.uuid,
                    lost="offbus" in kinds,
                    new_xids=tuple(new_xids.get(g.uuid, ())),
                    ecc_volatile_uncorrected=int(vol.get("uncorrected") or 0) + extra_ecc,
                    ecc_volatile_corrected=int(vol.get("corrected") or 0),
                    ecc_aggregate_uncorrected=int(agg.get("uncorrected") or 0) + extra_ecc,
                    ecc_aggregate_corrected=int(agg.get("corrected") or 0),
                    remap_pending=bool(remap.get("pending")) or "remap-pending" in kinds,
                    remap_failed=bool(remap.get("failure")) or "remap-failed" in kinds,
                    throttle=("hw-slowdown",) if "throttle" in kinds else (),
                    utilization_pct=util,
                    memory_used_bytes=int(g.memory_mib * util / 100) << 20,
                    memory_total_bytes=g.memory_mib << 20,
                    temperature_c=d.get("temperature_c"),
                    power_w=d.get("power_w"),
                )
            )
        total = inv.memory_bytes
        return HealthReading(
            gpus=tuple(gpus),
            host=HostReading(
                memory_total_bytes=total,
                memory_available_bytes=total // 100 if "memory-low" in host else total // 2,
                disk_total_bytes=FAKE_DISK_BYTES,
                disk_free_bytes=LOW_DISK_BYTES if "disk-low" in host else FAKE_DISK_BYTES // 2,
            ),
        )
