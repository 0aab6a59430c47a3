"""`nvidia-driver`: the NVIDIA driver of a branch (and version) from the OS package manager, and when it loads.

Settings: `{"branch": "550"}`, `{"version": "550.127.05"}` (its branch implied)
or both, and `"activate": "reboot"` (the default) or `"reload"`.

A pass reads three facts: the package manager (agent.converge.gpu_packages,
from `etc/os-release`), the installed version (`dpkg-query` / `rpm -q`) and
the loaded one (the inventory's `driver_version`, NVML's). The rules over them
are the pure functions below:

* `needs_install`: nothing of the branch installed, or another version than
  the one asked: install it (apt: then `apt-mark hold`), in one command, which
  the package manager carries out whole or not at all.
* `mismatch`: the loaded driver is not the one asked, or not the one
  installed (a newer install waits to load). That is the `DriverMismatch`
  condition (True), reason:
  - `RebootRequired` (`activate: reboot`): a reboot loads it. The node never
    reboots itself: a reboot is a job (`bc jobs run reboot --nodes N`, whose
    Drain waits until no hold is live, under the quorum where approvers exist),
    which the health reconciler starts from this condition;
  - `ReloadWaiting` (`activate: reload`) while any GPU has a hold (the
    devices converger's CDI files): the modules are never unloaded under a
    workload; with no hold, the unit reloads them itself (`modprobe -r` of
    the driver's modules, then `modprobe -a`), and a reload that fails (a
    process holds `/dev/nvidia*`: persistenced, Fabric Manager, DCGM) is
    `ReloadFailed`, retried every pass;
  - `InstallFailed`, `NoDriverLoaded`.
  False (`Matches`) once the loaded driver is the one asked and installed.

The section converges once the package is installed (and reloaded when that
is due and allowed): a rollout does not wait for the reboot, the condition
does. Removing the unit lets go of the hold on the package; the driver stays
installed and loaded (taking a GPU node's driver away is not a config undo).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agent.converge.gpu_packages import Package, driver_reload_argv
from agent.converge.host_units.base import (
    Applied,
    HostContext,
    Record,
    bad,
    good,
    host_manager,
    installed_version,
)
from agent.health.rules import DRIVER_MISMATCH, Verdict
from bc.protocol.host_units import Driver, UnitInvalid, parse_driver

CONDITION = (DRIVER_MISMATCH, "False")


@dataclass(frozen=True)
class DriverState:
    installed: str
    """The installed upstream version ("" none)."""
    loaded: str
    """The loaded driver's version, NVML's ("" none)."""


def needs_install(want: Driver, s: DriverState) -> bool:
    return not s.installed or not want.wants(s.installed)


def mismatch(want: Driver, s: DriverState) -> bool:
    return not s.loaded or not want.wants(s.loaded) or (bool(s.installed) and s.loaded != s.installed)


def reload_due(want: Driver, s: DriverState, held: bool) -> bool:
    """Reload the modules now: asked for, installed, not loaded, and no GPU held."""
    return want.activate == "reload" and not needs_install(want, s) and mismatch(want, s) and not held


def verdict(want: Driver, s: DriverState, held: bool, error: str | None) -> Verdict:
    asked = want.version or f"branch {want.branch}"
    if error is not None:
        reason = "InstallFailed" if needs_install(want, s) else "ReloadFailed"
        return bad(CONDITION, reason, error)
    if not mismatch(want, s):
        return good(CONDITION, "Matches", f"driver {s.loaded} is loaded")
    if not s.loaded:
        return bad(CONDITION, "NoDriverLoaded", f"no NVIDIA driver is loaded; the spec asks for {asked}")
    head = f"driver {s.loaded} is loaded; the spec asks for {asked}"
    if needs_install(want, s):
        return bad(CONDITION, "InstallFailed", f"{head}, and it is not installed")
    if want.activate == "reload":
        why = "once no GPU is held" if held else "on the next pass"
        return bad(CONDITION, "ReloadWaiting", f"{head} (installed {s.installed}): its modules are reloaded {why}")
    return bad(CONDITION, "RebootRequired", f"{head} (installed {s.installed}): a reboot loads it")


class NvidiaDriver:
    name = "nvidia-driver"
    condition, good = CONDITION

    def parse(self, settings: Mapping[str, Any]) -> Driver:
        return parse_driver(settings)

    async def check(self, desired: Driver, ctx: HostContext) -> None:
        await host_manager(ctx, self.name)

    async def _state(self, desired: Driver, ctx: HostContext, manager: str) -> DriverState:
        installed = await installed_version(ctx, manager, Package(self.name, desired.branch))
        return DriverState(installed, (await ctx.inventory()).driver_version)

    async def _held(self, ctx: HostContext) -> bool:
        return bool(await ctx.held_gpus())

    async def drifted(self, desired: Driver, record: Record, ctx: HostContext) -> bool:
        s = await self._state(desired, ctx, await host_manager(ctx, self.name))
        if needs_install(desired, s):
            return True
        return desired.activate == "reload" and mismatch(desired, s) and not await self._held(ctx)

    async def apply(self, desired: Driver, record: Record | None, ctx: HostContext) -> Applied:
        manager = await host_manager(ctx, self.name)
        pkg = Package(self.name, desired.branch, desired.version)
        old = _old_branch(record)
        if old and old != desired.branch:  # a new branch: the old one's hold goes (apt replaces the package)
            await ctx.ops.package(manager, "release", Package(self.name, old))
        s = await self._state(desired, ctx, manager)
        if needs_install(desired, s):
            await ctx.ops.package(manager, "install", pkg)
            s = await self._state(desired, ctx, manager)
        if reload_due(desired, s, await self._held(ctx)):
            for argv in driver_reload_argv():
                await ctx.ops.command(*argv)
        return Applied(undo={"manager": manager, "branch": desired.branch})

    async def remove(self, record: Record, ctx: HostContext) -> None:
        manager, branch = record.undo.get("manager"), record.undo.get("branch")
        if isinstance(manager, str) and isinstance(branch, str) and branch:
            await ctx.ops.package(manager, "release", Package(self.name, branch))

    async def conditions(self, desired: Driver, error: str | None, ctx: HostContext) -> list[Verdict]:
        s = await self._state(desired, ctx, await host_manager(ctx, self.name))
        return [verdict(desired, s, await self._held(ctx), error)]


def _old_branch(record: Record | None) -> str:
    if record is None:
        return ""
    try:
        return parse_driver(json.loads(record.settings)).branch
    except (ValueError, TypeError, UnitInvalid):
        return ""
