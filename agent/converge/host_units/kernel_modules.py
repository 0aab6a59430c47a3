"""`kernel-modules`: modules loaded now (`modprobe`) and at every boot (`etc/modules-load.d/bc-kernel-modules.conf`).

Settings: `{"modules": ["vfio_pci", "nvidia_peermem"]}`, each a module name
of `A-Z a-z 0-9 _ -`. Applying writes the list, then loads each module in
order; a module that fails to load restores the previous list (the modules
already loaded stay loaded: unloading one a workload may use is worse). The
unit's removal removes the list; loaded modules stay until the next boot.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agent.converge.host_units.base import (
    HEADER,
    Applied,
    HostContext,
    Record,
    files_drifted,
    write_then_run,
)
from bc.protocol.host_units import parse_modules

DROP_IN = "etc/modules-load.d/bc-kernel-modules.conf"


class KernelModules:
    name = "kernel-modules"

    def parse(self, settings: Mapping[str, Any]) -> tuple[str, ...]:
        return parse_modules(settings)

    async def check(self, desired: tuple[str, ...], ctx: HostContext) -> None:
        return None

    async def drifted(self, desired: tuple[str, ...], record: Record, ctx: HostContext) -> bool:
        return await files_drifted(record, ctx.ops)

    async def apply(self, desired: tuple[str, ...], record: Record | None, ctx: HostContext) -> Applied:
        files = {DROP_IN: (HEADER.format(unit=self.name) + "".join(f"{m}\n" for m in desired)).encode()}
        return await write_then_run(ctx.ops, files, record, [("modprobe", m) for m in desired])

    async def remove(self, record: Record, ctx: HostContext) -> None:
        await ctx.ops.remove(DROP_IN)
