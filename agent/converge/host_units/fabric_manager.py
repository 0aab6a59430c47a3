"""`fabric-manager`: NVIDIA Fabric Manager installed and running at the driver's version, on NVSwitch systems.

Settings: `{"branch": "550"}` and/or `{"version": "550.127.05"}`, as
`nvidia-driver`'s (give both units the same).

An HGX baseboard's GPUs talk through NVSwitches, which Fabric Manager
programs; without it CUDA on those GPUs fails. A host has NVSwitches when
PCI lists an NVIDIA bridge (`sys/bus/pci/devices/*/vendor` 0x10de, `class`
0x0680…), read before any driver is loaded. On a host without one the unit
does nothing (`FabricManagerReady` True, `NotNeeded`).

On an NVSwitch host a pass installs the package when the version differs
(`nvidia-fabricmanager-<branch>` on apt, held; `nvidia-fabric-manager` on
dnf) and enables the service. Fabric Manager refuses to start against a
driver of another version, so it is (re)started only when the loaded driver
(the inventory's) is the installed Fabric Manager's version; otherwise it
waits, enabled, for the reboot that loads the new driver (it starts at boot),
and the unit is still applied: the condition says what waits.

`FabricManagerReady`: True `Running` / `NotNeeded`; False `NotInstalled`,
`VersionMismatch` (Fabric Manager and the loaded driver differ), `NotRunning`,
`ApplyFailed`. Removing the unit stops and disables the service and lets go
of the package's hold (the package stays).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agent.converge.gpu_packages import FABRIC_MANAGER_SERVICE, Package, fabric_manager_argv, is_nvswitch
from agent.converge.host_units.base import Applied, HostContext, Record, bad, good, host_manager, installed_version
from agent.health.rules import FABRIC_MANAGER_READY, Verdict
from bc.protocol.host_units import Driver, parse_fabric_manager

CONDITION = (FABRIC_MANAGER_READY, "True")
PCI_DEVICES = "sys/bus/pci/devices"


@dataclass(frozen=True)
class FmState:
    nvswitches: tuple[str, ...]
    installed: str
    active: bool
    loaded: str


def needs_install(want: Driver, s: FmState) -> bool:
    return bool(s.nvswitches) and (not s.installed or not want.wants(s.installed))


def may_start(s: FmState) -> bool:
    """Fabric Manager starts only against a driver of its own version."""
    return bool(s.installed) and s.installed == s.loaded


def verdict(want: Driver, s: FmState, error: str | None) -> Verdict:
    if not s.nvswitches:
        return good(CONDITION, "NotNeeded", "this host has no NVSwitch")
    if error is not None:
        return bad(CONDITION, "ApplyFailed", error)
    if not s.installed or not want.wants(s.installed):
        return bad(
            CONDITION, "NotInstalled", f"Fabric Manager {want.version or 'of branch ' + want.branch} is not installed"
        )
    if not may_start(s):
        return bad(
            CONDITION,
            "VersionMismatch",
            f"Fabric Manager {s.installed} waits for the driver of its version (loaded: {s.loaded or 'none'})",
        )
    if not s.active:
        return bad(CONDITION, "NotRunning", f"{FABRIC_MANAGER_SERVICE} is not active")
    return good(CONDITION, "Running", f"Fabric Manager {s.installed} runs for {len(s.nvswitches)} NVSwitches")


def nvswitches(devices: Mapping[str, tuple[str, str]]) -> tuple[str, ...]:
    """The PCI addresses among `devices` (address -> (vendor, class)) that are NVSwitches, sorted."""
    return tuple(sorted(a for a, (vendor, cls) in devices.items() if is_nvswitch(vendor, cls)))


class FabricManager:
    name = "fabric-manager"
    condition, good = CONDITION

    def parse(self, settings: Mapping[str, Any]) -> Driver:
        return parse_fabric_manager(settings)

    async def check(self, desired: Driver, ctx: HostContext) -> None:
        await host_manager(ctx, self.name)

    async def _switches(self, ctx: HostContext) -> tuple[str, ...]:
        devices: dict[str, tuple[str, str]] = {}
        for addr in await ctx.ops.list_dir(PCI_DEVICES):
            vendor = await ctx.ops.read(f"{PCI_DEVICES}/{addr}/vendor")
            if vendor is None or vendor.strip().lower() != b"0x10de":
                continue
            cls = await ctx.ops.read(f"{PCI_DEVICES}/{addr}/class")
            devices[addr] = (vendor.decode(), (cls or b"").decode("ascii", "replace"))
        return nvswitches(devices)

    async def _state(self, desired: Driver, ctx: HostContext, manager: str) -> FmState:
        switches = await self._switches(ctx)
        if not switches:
            return FmState((), "", False, "")
        installed = await installed_version(ctx, manager, Package(self.name, desired.branch))
        active = await ctx.ops.query("systemctl", "is-active", FABRIC_MANAGER_SERVICE)
        loaded = (await ctx.inventory()).driver_version
        return FmState(switches, installed, active.stdout.strip() == b"active", loaded)

    async def drifted(self, desired: Driver, record: Record, ctx: HostContext) -> bool:
        s = await self._state(desired, ctx, await host_manager(ctx, self.name))
        return needs_install(desired, s) or (bool(s.nvswitches) and may_start(s) and not s.active)

    async def apply(self, desired: Driver, record: Record | None, ctx: HostContext) -> Applied:
        manager = await host_manager(ctx, self.name)
        s = await self._state(desired, ctx, manager)
        if not s.nvswitches:
            return Applied(undo={"manager": manager, "branch": desired.branch, "service": False})
        old = record.undo.get("branch") if record is not None else None
        if isinstance(old, str) and old and old != desired.branch:
            await ctx.ops.package(manager, "release", Package(self.name, old))
        changed = needs_install(desired, s)
        if changed:
            await ctx.ops.package(manager, "install", Package(self.name, desired.branch, desired.version))
            s = await self._state(desired, ctx, manager)
        await ctx.ops.command(*fabric_manager_argv("enable"))
        if may_start(s) and (changed or not s.active):
            await ctx.ops.command(*fabric_manager_argv("restart"))
        return Applied(undo={"manager": manager, "branch": desired.branch, "service": True})

    async def remove(self, record: Record, ctx: HostContext) -> None:
        manager, branch = record.undo.get("manager"), record.undo.get("branch")
        if not record.undo.get("service"):
            return  # a host without NVSwitches: nothing was installed or started
        await ctx.ops.command(*fabric_manager_argv("disable"))
        if isinstance(manager, str) and isinstance(branch, str) and branch:
            await ctx.ops.package(manager, "release", Package(self.name, branch))

    async def conditions(self, desired: Driver, error: str | None, ctx: HostContext) -> list[Verdict]:
        s = await self._state(desired, ctx, await host_manager(ctx, self.name))
        return [verdict(desired, s, error)]
