"""What a host unit is: parse its settings (pure), check them against the host, apply them whole, remove them.

Each unit module (sysctl, kernel_modules, hugepages, mig, gpu_sharing) is one
class with this shape. The converger (agent.converge.host) calls, per pass:

* `parse(settings)`: pure; `UnitInvalid` (bad input: the section fails
  terminally at this generation, nothing is touched) or the unit's desired
  value, hashable into the unit's record;
* `check(desired, ctx)`: what only the host can say (a huge page size, a MIG
  profile); `UnitInvalid` again;
* `drifted(desired, record, ctx)`: whether the host still matches what the
  record says was applied (files by hash, sysfs values, the MIG layout);
* `apply(desired, record, ctx) -> undo`: every effect through `ctx.ops`
  (agent.converge.host_ops). A failure raises OSError after the unit undid
  what it had done, so a unit is applied whole or not at all; the section
  stays PROGRESSING and the next pass tries again. Returns what `remove`
  needs later (prior sysfs values);
* `remove(record, ctx)`: the unit left the spec: its drop-ins go, its
  runtime effects are undone where that means something.

`write_files` is the shared whole-or-nothing write of a unit's drop-ins.

The GPU node units (nvidia_driver, fabric_manager, container_toolkit,
kubernetes) also say what they see as a condition (`Observed`): after every
pass the converger asks each for its verdicts (agent.health.rules), which the
health monitor reports with the node's other conditions, so a health
reconciler sees a unit that failed or waits. `host_manager` and
`installed_version` are their shared reads of the host.
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from agent.converge.gpu_packages import Package, package_manager, query_argv, upstream_version
from agent.converge.host_ops import HostOps
from agent.converge.secret_port import SecretSource
from agent.health.rules import Verdict
from agent.hw.base import HardwareBackend
from bc.protocol.host_units import UnitInvalid
from bc.protocol.pb import common_pb2

__all__ = [
    "Applied",
    "HostContext",
    "Observed",
    "Record",
    "Unit",
    "UnitInvalid",
    "files_drifted",
    "restore_files",
    "write_files",
    "write_then_run",
]

HEADER = "# Written by bc (host unit {unit}). Do not edit: the next converge pass rewrites it.\n"


@dataclass(frozen=True)
class Record:
    """What the converger remembers of an applied unit (`etc/bc/host-units/<name>.json` under the root)."""

    unit: str
    settings: str  # canonical JSON of the settings applied
    files: dict[str, str] = field(default_factory=dict)  # rel path -> sha256 of the content written
    undo: dict[str, Any] = field(default_factory=dict)  # unit-specific: what `remove` restores

    def doc(self) -> dict[str, Any]:
        return {"unit": self.unit, "settings": self.settings, "files": self.files, "undo": self.undo}


@dataclass
class HostContext:
    ops: HostOps
    hw: HardwareBackend
    inventory: Callable[[], Awaitable[common_pb2.Inventory]]
    held_gpus: Callable[[], Awaitable[set[str]]]
    """GPU UUIDs with a hold on them or on a part of them (the devices converger's CDI files)."""
    cdi_dir: Path | None = None
    """Where bc's CDI specs are (the container runtimes are pointed there)."""
    node_labels: Callable[[], Mapping[str, str]] = dict
    """The node's bc labels, as its held (signed) spec body carries them (the kubernetes unit's node labels)."""
    secrets: SecretSource | None = None
    """The secret broker (docs/secrets.md), for a unit whose settings name a secret (`kubernetes`)."""
    generation: int = 0
    """The spec generation this pass converges: what a secret request is bound to."""


@dataclass(frozen=True)
class Applied:
    """What `apply` leaves behind: the files written (by hash) and the unit's undo data."""

    files: dict[str, str] = field(default_factory=dict)
    undo: dict[str, Any] = field(default_factory=dict)


class Unit(Protocol):
    name: str

    def parse(self, settings: Mapping[str, Any]) -> Any: ...

    async def check(self, desired: Any, ctx: HostContext) -> None: ...

    async def drifted(self, desired: Any, record: Record, ctx: HostContext) -> bool: ...

    async def apply(self, desired: Any, record: Record | None, ctx: HostContext) -> Applied: ...

    async def remove(self, record: Record, ctx: HostContext) -> None: ...


@runtime_checkable
class Observed(Protocol):
    """A unit whose state is a condition: `condition` its type, `good` the status that means all is well."""

    condition: str
    good: str

    async def conditions(self, desired: Any, error: str | None, ctx: HostContext) -> list[Verdict]:
        """The unit's verdicts after a pass; `error` is why its apply failed in this pass (None: it did not)."""
        ...


def bad(condition: tuple[str, str], reason: str, message: str) -> Verdict:
    """`condition`: its type and the status that is good; this verdict has the other."""
    return Verdict(condition[0], "False" if condition[1] == "True" else "True", reason, message)


def good(condition: tuple[str, str], reason: str, message: str = "") -> Verdict:
    return Verdict(condition[0], condition[1], reason, message)


async def host_manager(ctx: HostContext, unit: str) -> str:
    """apt or dnf, from the host's `etc/os-release`; UnitInvalid on a host with neither."""
    data = await ctx.ops.read("etc/os-release")
    if data is None:
        data = await ctx.ops.read("usr/lib/os-release")
    manager = package_manager(data.decode("utf-8", "replace")) if data is not None else None
    if manager is None:
        raise UnitInvalid(f"{unit}: this host's OS (etc/os-release) has neither apt nor dnf")
    return manager


async def installed_version(ctx: HostContext, manager: str, pkg: Package) -> str:
    """The package's installed upstream version (`550.127.05`), or "" when it is not installed."""
    result = await ctx.ops.query(*query_argv(manager, pkg))
    text = result.stdout.decode("utf-8", "replace").strip()
    return upstream_version(text) if result.returncode == 0 and text else ""


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


async def files_drifted(record: Record, ops: HostOps) -> bool:
    """Whether any file the record wrote is gone or changed."""
    for rel, digest in sorted(record.files.items()):
        data = await ops.read(rel)
        if data is None or sha256(data) != digest:
            return True
    return False


async def write_files(ops: HostOps, files: Mapping[str, bytes], old: Record | None) -> dict[str, bytes | None]:
    """Write the unit's files (and remove the ones its previous version wrote that it no longer does).

    Returns each touched path's previous content (None: absent), for `restore_files`. A failed write
    restores what this call had already changed, then raises.
    """
    prior: dict[str, bytes | None] = {}
    stale = sorted(set(old.files) - set(files)) if old is not None else []
    try:
        for rel, data in sorted(files.items()):
            prior[rel] = await ops.read(rel)
            if prior[rel] != data:
                await ops.write(rel, data)
        for rel in stale:
            prior[rel] = await ops.read(rel)
            await ops.remove(rel)
    except OSError:
        await restore_files(ops, prior)
        raise
    return prior


async def restore_files(ops: HostOps, prior: Mapping[str, bytes | None]) -> None:
    """Put files back as they were (best effort: a rollback that fails leaves the next pass to retry)."""
    for rel, data in sorted(prior.items()):
        try:
            if data is None:
                await ops.remove(rel)
            else:
                await ops.write(rel, data)
        except OSError:
            continue


async def write_then_run(
    ops: HostOps, files: Mapping[str, bytes], old: Record | None, commands: Sequence[Sequence[str]]
) -> Applied:
    """A drop-in unit's apply: write its files, then run `commands` in order; a command that fails puts the
    files back as they were and raises, so the unit is applied whole or not at all."""
    prior = await write_files(ops, files, old)
    try:
        for argv in commands:
            await ops.command(*argv)
    except OSError:
        await restore_files(ops, prior)
        raise
    return Applied(hashes(files))


def hashes(files: Mapping[str, bytes]) -> dict[str, str]:
    return {rel: sha256(data) for rel, data in sorted(files.items())}
