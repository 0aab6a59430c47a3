"""The condition rules: readings and agent facts in, verdicts out. Pure, so every case is a unit test.

Polarity follows the reference: `GpuHealthy`, `NodeReady` and the host
units' `…Ready` / `KubernetesJoined` are good when True; `ClockSkew`,
`JournalFull`, `HostResourcesExhausted` and `DriverMismatch` are good when
False. Each GPU has its own condition, typed `GpuHealthy/<GPU uuid>`, so a
change to one GPU is one change in the events log.

A GPU is unhealthy while it is off the bus, shows uncorrectable volatile ECC
errors, a failed or pending row remap, a throttle reason that means trouble,
or a critical XID seen this boot. XIDs are events, not state: they stay until
a `gpu.reset` after which the GPU reads healthy (`reads_healthy`), or until
the agent restarts. The reason is the worst problem; the message lists all.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from agent.health import xid as xid_table
from agent.health.readings import GpuReading, HostReading

GPU_HEALTHY = "GpuHealthy"
NODE_READY = "NodeReady"
CLOCK_SKEW = "ClockSkew"
JOURNAL_FULL = "JournalFull"
HOST_EXHAUSTED = "HostResourcesExhausted"
# The GPU node host units' own (agent.converge.host_units: each unit says what it sees after a converge pass).
DRIVER_MISMATCH = "DriverMismatch"
FABRIC_MANAGER_READY = "FabricManagerReady"
CONTAINER_TOOLKIT_READY = "ContainerToolkitReady"
KUBERNETES_JOINED = "KubernetesJoined"
GOOD_WHEN_TRUE = frozenset({NODE_READY, FABRIC_MANAGER_READY, CONTAINER_TOOLKIT_READY, KUBERNETES_JOINED})
"""Conditions that are good when True (with every `GpuHealthy/<uuid>`); the others are good when False."""

CLOCK_SKEW_MS = 1000
"""More than a second off the server's clock, as the control plane's own ClockSkew (bc.control.doctor.clock_skew)."""
MEMORY_LOW_FRACTION = 0.05
"""Less than 5 % of the host's memory available."""
DISK_LOW_BYTES = 256 << 20
"""Less than 256 MiB free where the journal lives: the next fsync may fail."""


@dataclass(frozen=True)
class Verdict:
    type: str
    status: str  # True | False | Unknown
    reason: str
    message: str = ""


def gpu_type(uuid: str) -> str:
    return f"{GPU_HEALTHY}/{uuid}"


def gpu_of(condition_type: str) -> str | None:
    """The GPU uuid of a `GpuHealthy/<uuid>` condition type, else None."""
    prefix = GPU_HEALTHY + "/"
    return condition_type[len(prefix) :] if condition_type.startswith(prefix) else None


def gpu_verdict(r: GpuReading, xids: Sequence[int]) -> Verdict:
    problems: list[tuple[str, str]] = []
    if r.lost:
        problems.append(("FallenOffBus", "GPU has fallen off the bus"))
    if (r.ecc_volatile_uncorrected or 0) > 0:
        problems.append(("EccUncorrectable", f"{r.ecc_volatile_uncorrected} uncorrectable volatile ECC errors"))
    if r.remap_failed:
        problems.append(("RowRemapFailed", "a row remap failed"))
    if r.remap_pending:
        problems.append(("RowRemapPending", "a row remap is pending until the GPU is reset"))
    problems.extend((f"Xid{x}", f"XID {x}: {xid_table.describe(x)}") for x in xids)
    if r.throttle:
        problems.append(("Throttled", "throttled: " + ", ".join(r.throttle)))
    if not problems:
        return Verdict(gpu_type(r.uuid), "True", "Healthy")
    return Verdict(gpu_type(r.uuid), "False", problems[0][0], "; ".join(text for _, text in problems))


def reads_healthy(r: GpuReading) -> bool:
    """The reference's rule after a reset: on the bus, no uncorrectable volatile ECC, no pending or failed remap."""
    return not (r.lost or (r.ecc_volatile_uncorrected or 0) > 0 or r.remap_pending or r.remap_failed)


def clock_skew_verdict(offset_ms: int | None) -> Verdict:
    if offset_ms is None:
        return Verdict(CLOCK_SKEW, "Unknown", "NoServerTime", "no Welcome yet: the server's time is not known")
    if abs(offset_ms) > CLOCK_SKEW_MS:
        side = "behind" if offset_ms > 0 else "ahead of"
        return Verdict(CLOCK_SKEW, "True", "Skewed", f"this host's clock is {abs(offset_ms)} ms {side} the server's")
    return Verdict(CLOCK_SKEW, "False", "InSync")


def journal_full_verdict(full: bool) -> Verdict:
    if full:
        return Verdict(JOURNAL_FULL, "True", "AtBound", "the journal is at its bound: new commands are answered BUSY")
    return Verdict(JOURNAL_FULL, "False", "HasRoom")


def host_verdict(h: HostReading) -> Verdict:
    problems: list[tuple[str, str]] = []
    total, available = h.memory_total_bytes, h.memory_available_bytes
    if total and available is not None and available < total * MEMORY_LOW_FRACTION:
        problems.append(("MemoryLow", f"{available >> 20} MiB of {total >> 20} MiB available"))
    if h.disk_free_bytes is not None and h.disk_free_bytes < DISK_LOW_BYTES:
        problems.append(("DiskLow", f"{h.disk_free_bytes >> 20} MiB free under the agent's data dir"))
    if not problems:
        return Verdict(HOST_EXHAUSTED, "False", "HasRoom")
    return Verdict(HOST_EXHAUSTED, "True", problems[0][0], "; ".join(text for _, text in problems))


def node_ready_verdict(others: Sequence[Verdict], converge_error: str) -> Verdict:
    """Ready unless the journal is full, the host is out of memory or disk, or the last converge pass broke."""
    why = [v.type for v in others if v.type in (JOURNAL_FULL, HOST_EXHAUSTED) and v.status == "True"]
    if converge_error:
        why.append("ConvergeError")
    if why:
        message = ", ".join(why) + (f": {converge_error}" if converge_error else "")
        return Verdict(NODE_READY, "False", why[0], message)
    return Verdict(NODE_READY, "True", "Ready")
