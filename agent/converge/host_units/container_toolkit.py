"""`container-toolkit`: nvidia-container-toolkit in CDI mode, and each container runtime reading bc's CDI specs.

Settings: `{"runtimes": ["containerd", "docker", "cri-o"], "version": "1.17.3"}`
(`version` optional: the newest).

A pass installs `nvidia-container-toolkit` when it is missing or of another
version (held on apt), then merges bc's keys into each configuration file
(agent.converge.runtime_config: the toolkit's `mode = "cdi"` and spec dirs,
containerd's and docker's `enable_cdi` / `cdi-spec-dirs`, cri-o's own
drop-in), keeping every other setting of the operator's, and restarts each
runtime whose file changed (`systemctl restart containerd.service`, ...;
containerd and cri-o keep running containers across a restart, docker only
with `live-restore`). A runtime the settings no longer name gets bc's keys
taken out again and is restarted.

Whole or not at all: when a restart fails, each runtime this pass added gets
bc's keys taken out again (and a restart, best effort), and the pass retries.
A configuration file that does not parse is left alone (`ConfigUnreadable`).
Drift is a file whose merge would change it (an operator's edit of bc's
keys; their other edits are theirs).

`ContainerToolkitReady`: True `Configured`; False `ApplyFailed`. Removing the
unit takes bc's keys out of every file (the runtime's defaults again),
restarts the runtimes whose file changed, and lets go of the package's hold
(the toolkit stays installed).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from agent.converge import runtime_config
from agent.converge.gpu_packages import Package
from agent.converge.host_units.base import (
    Applied,
    HostContext,
    Record,
    UnitInvalid,
    bad,
    good,
    host_manager,
    installed_version,
)
from agent.health.rules import CONTAINER_TOOLKIT_READY, Verdict
from bc.protocol.host_units import Toolkit, parse_toolkit

log = logging.getLogger(__name__)

CONDITION = (CONTAINER_TOOLKIT_READY, "True")
PACKAGE = Package("container-toolkit")


def files_for(runtimes: Sequence[str]) -> list[str]:
    """The configuration files the unit keeps, by runtime_config kind: the toolkit's, then each runtime's."""
    return ["toolkit", *runtimes]


def needs_install(want: Toolkit, installed: str) -> bool:
    return not installed or (bool(want.version) and installed != want.version)


class ContainerToolkit:
    name = "container-toolkit"
    condition, good = CONDITION

    def parse(self, settings: Mapping[str, Any]) -> Toolkit:
        return parse_toolkit(settings)

    async def check(self, desired: Toolkit, ctx: HostContext) -> None:
        await host_manager(ctx, self.name)
        if ctx.cdi_dir is None:
            raise UnitInvalid("container-toolkit: this agent keeps no CDI directory to point the runtimes at")

    def _dir(self, ctx: HostContext) -> str:
        assert ctx.cdi_dir is not None, "check() refuses the unit without a CDI directory"
        return str(ctx.cdi_dir)

    async def drifted(self, desired: Toolkit, record: Record, ctx: HostContext) -> bool:
        manager = await host_manager(ctx, self.name)
        if needs_install(desired, await installed_version(ctx, manager, PACKAGE)):
            return True
        dirs = runtime_config.cdi_dirs(self._dir(ctx))
        for kind in files_for(desired.runtimes):
            data = await ctx.ops.read(runtime_config.CONFIG_FILES[kind])
            text = data.decode("utf-8", "replace") if data is not None else None
            try:
                if runtime_config.merged(kind, text, dirs, True) != text:
                    return True
            except runtime_config.ConfigUnreadable:
                return True  # apply says so, retryably
        return False

    async def apply(self, desired: Toolkit, record: Record | None, ctx: HostContext) -> Applied:
        manager = await host_manager(ctx, self.name)
        if needs_install(desired, await installed_version(ctx, manager, PACKAGE)):
            await ctx.ops.package(manager, "install", Package(self.name, "", desired.version))
        before = _runtimes(record)
        cdi_dir = self._dir(ctx)
        changed = [k for k in files_for(desired.runtimes) if await ctx.ops.runtime_config(k, True, cdi_dir)]
        dropped = [r for r in before if r not in desired.runtimes]
        changed += [r for r in dropped if await ctx.ops.runtime_config(r, False, cdi_dir)]
        added = [r for r in desired.runtimes if r not in before]
        try:
            for kind in changed:
                if kind in runtime_config.SERVICES:
                    await ctx.ops.command("systemctl", "restart", runtime_config.SERVICES[kind])
        except OSError:
            for kind in added:
                try:
                    if await ctx.ops.runtime_config(kind, False, cdi_dir):
                        await ctx.ops.command("systemctl", "restart", runtime_config.SERVICES[kind])
                except OSError as e:
                    log.warning("event=host.toolkit_rollback_failed runtime=%s error=%r", kind, str(e))
            raise
        return Applied(undo={"manager": manager, "runtimes": list(desired.runtimes)})

    async def remove(self, record: Record, ctx: HostContext) -> None:
        cdi_dir = str(ctx.cdi_dir or "")
        for kind in files_for(_runtimes(record)):
            if await ctx.ops.runtime_config(kind, False, cdi_dir) and kind in runtime_config.SERVICES:
                await ctx.ops.command("systemctl", "restart", runtime_config.SERVICES[kind])
        manager = record.undo.get("manager")
        if isinstance(manager, str):
            await ctx.ops.package(manager, "release", PACKAGE)

    async def conditions(self, desired: Toolkit, error: str | None, ctx: HostContext) -> list[Verdict]:
        if error is not None:
            return [bad(CONDITION, "ApplyFailed", error)]
        return [
            good(
                CONDITION,
                "Configured",
                f"CDI mode in {', '.join(desired.runtimes)}; bc's CDI specs from {self._dir(ctx)}",
            )
        ]


def _runtimes(record: Record | None) -> list[str]:
    if record is None:
        return []
    got = record.undo.get("runtimes")
    return [r for r in got if r in runtime_config.SERVICES] if isinstance(got, list) else []
