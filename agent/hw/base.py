"""What the agent needs from the machine's hardware, whatever provides it.

The agent sees GPUs only through this protocol, so `bc node --fake-hw` can
swap NVML for a seeded fake and nothing else in the agent changes. The
command kinds (diagnostics, GPU reset, reboot) go through it too, for the
same reason: a fake node runs every kind end to end without touching the
host it runs on.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from agent.health.readings import HealthSource
from bc.protocol.canonical import canonical_json, message_to_dict
from bc.protocol.pb import common_pb2

BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"
UNKNOWN_GPU = "unknown GPU"
"""The diag entry's `error` and gpu.reset's per-GPU message for a UUID the inventory does not know."""


class ActionDisabled(Exception):
    """The agent's config does not let it take this action on real hardware (e.g. a reboot)."""


class HardwareBackend(Protocol):
    capabilities: Capabilities
    """What the backend can do to the machine it runs on: the wiring asks this, never the backend's type."""

    def inventory(self) -> common_pb2.Inventory:
        """The node's GPUs (and host basics) as they are now; may block (NVML), so call it off the loop."""
        ...

    def boot_id(self) -> str:
        """The kernel's boot id: it changes exactly when the machine reboots."""
        ...

    def describe(self) -> str:
        """One line for logs and `bc node` start-up: which backend, how many GPUs."""
        ...

    def diag(self, uuids: Sequence[str]) -> dict[str, dict[str, Any]]:
        """Health counters per GPU UUID (every GPU when `uuids` is empty); may block, so call it off the loop.

        Each entry has the keys of `diag_entry`, a counter the backend cannot read
        being None; a UUID the backend does not know maps to `{"error": "unknown GPU"}`.
        """
        ...

    async def reset_gpu(self, uuid: str, *, allow: bool = False) -> tuple[bool, str]:
        """Reset one GPU: (done, message). Real hardware acts only when `allow` (the agent's config) says so."""
        ...

    async def reboot(self, *, allow: bool = False) -> tuple[bool, str]:
        """Reboot the machine. Raises ActionDisabled when real hardware is not allowed to.

        On real hardware a successful call never returns (the process dies with
        the machine); it returns (False, why) when the reboot could not be asked for.
        """
        ...


def inventory_hash(inv: common_pb2.Inventory) -> str:
    """`sha256:<hex>` of the inventory's canonical JSON.

    Canonical JSON rather than protobuf bytes, so the hash is the same for
    the same inventory on every protobuf version and both ends of the wire.
    """
    return _hash_of(inv.SerializeToString(deterministic=True))


@functools.lru_cache(maxsize=16384)  # one entry per distinct inventory: a host has one; a simulator, thousands
def _hash_of(wire: bytes) -> str:
    # Keyed by the bytes only to skip recomputing an inventory that did not change (every converge pass
    # asks); the hash itself stays over canonical JSON.
    inv = common_pb2.Inventory()
    inv.ParseFromString(wire)
    return "sha256:" + hashlib.sha256(canonical_json(message_to_dict(inv)).encode()).hexdigest()


def read_boot_id(path: str = BOOT_ID_PATH) -> str:
    """The kernel boot id, or "unknown" where the kernel does not offer one (not Linux)."""
    try:
        with open(path, encoding="ascii") as f:
            return f.read().strip() or "unknown"
    except OSError:
        return "unknown"


def diag_entry(
    *,
    index: int | None,
    name: str | None,
    ecc: Mapping[str, Any] | None,
    retired_pages: Mapping[str, Any] | None,
    row_remapping: Mapping[str, Any] | None,
    xids: list[dict[str, Any]] | None,
    clocks_mhz: Mapping[str, Any] | None,
    temperature_c: int | None,
    power_w: float | None,
    power_limit_w: float | None,
) -> dict[str, Any]:
    """One GPU's diag entry in the shape both backends report, with its `healthy` verdict filled in.

    One constructor for both backends, so the control plane reads the same
    keys from a fake node and a real one.
    """
    entry: dict[str, Any] = {
        "index": index,
        "name": name,
        "ecc": dict(ecc) if ecc is not None else None,
        "retired_pages": dict(retired_pages) if retired_pages is not None else None,
        "row_remapping": dict(row_remapping) if row_remapping is not None else None,
        "xids": xids,
        "clocks_mhz": dict(clocks_mhz) if clocks_mhz is not None else None,
        "temperature_c": temperature_c,
        "power_w": power_w,
        "power_limit_w": power_limit_w,
    }
    entry["healthy"] = diag_healthy(entry)
    return entry


def diag_healthy(entry: Mapping[str, Any]) -> bool:
    """Healthy unless it shows uncorrectable volatile ECC errors, or a pending or failed row remap.

    The reference's rule for a GPU after a reset; a pending page retirement
    (GPUs before row remapping) counts as a pending remap. A counter that could not be
    read (None) says nothing either way, so a GPU NVML cannot fully read is
    not condemned for it.
    """
    if "error" in entry:
        return False
    ecc = entry.get("ecc") or {}
    volatile = ecc.get("volatile") or {}
    if (volatile.get("uncorrected") or 0) > 0:
        return False
    remap = entry.get("row_remapping") or {}
    if remap.get("pending") or remap.get("failure"):
        return False
    retired = entry.get("retired_pages") or {}
    return not retired.get("pending")


@dataclass(frozen=True)
class ProcessResult:
    returncode: int
    stdout: bytes
    stderr: bytes

    def tail(self, limit: int = 2000) -> str:
        """The end of stderr (else stdout), decoded: what a failed tool said last."""
        data = (self.stderr.strip() or self.stdout.strip())[-limit:]
        return data.decode("utf-8", "replace")


async def run_process(argv: Sequence[str], *, timeout_s: float | None = None) -> ProcessResult:
    """Run a program (no shell) and collect its output; killed when it times out or the caller is cancelled.

    A cancelled command must not leave `nvidia-smi` or `dcgmi` running on
    behind the agent's back, so the child dies with the await.
    """
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        async with asyncio.timeout(timeout_s):
            stdout, stderr = await proc.communicate()
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await asyncio.shield(proc.wait())
        raise
    return ProcessResult(proc.returncode if proc.returncode is not None else -1, stdout, stderr)


HostTool = Callable[[Sequence[str]], ProcessResult]
"""A stand-in for a host command (argv in, its result out), e.g. the fake's `nvidia-smi` over its MIG model."""

HealthFactory = Callable[[Path, Sequence[str]], HealthSource]
"""The backend's health source, given the agent's data dir and `--fake-fault` specs (a model shows them;
real hardware has nothing to inject them into and ignores them)."""


@dataclass(frozen=True)
class Capabilities:
    """What a backend can do, so `bc node`'s wiring (agent.app, agent.converge.host_wiring) picks its other
    seams from it rather than from the backend's type (docs/design.md, "The agent's layers")."""

    touches_host: bool
    """True: the node acts on the machine itself (cgroup slices through systemd, the host's /dev, sshd
    reloads, host units under `/`). False: a model whose node must never touch the host it runs on, so each
    of those goes to a stand-in under the data dir."""
    health: HealthFactory
    tools: Mapping[str, HostTool] = field(default_factory=dict)
    """Host commands the backend answers itself: a stand-in host runner hands them these argv."""
    nvswitches: tuple[str, ...] = ()
    """A model's NVSwitches (PCI addresses), which its stand-in host root lists in sysfs; a real host's are
    read there."""
