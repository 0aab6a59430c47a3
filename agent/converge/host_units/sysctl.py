"""`sysctl`: kernel parameters as a drop-in, `etc/sysctl.d/90-bc-sysctl.conf`, applied with `sysctl -p`.

Settings: a JSON object of key to value, e.g. `{"vm.max_map_count": 262144}`.
A key is dotted names of `A-Z a-z 0-9 _ -` (no `/`, no `..`: the kernel
accepts `/` as a separator, and a drop-in must never name a path); a value is
a string or an integer with no line break, NUL or `#`. Removing the unit
removes the drop-in and re-runs `sysctl --system`; the values it set stay in
the running kernel until something else sets them or the host reboots (sysctl
has no "unset").
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
from bc.protocol.host_units import parse_values

DROP_IN = "etc/sysctl.d/90-bc-sysctl.conf"


def render(values: Mapping[str, str]) -> bytes:
    return (HEADER.format(unit="sysctl") + "".join(f"{k} = {v}\n" for k, v in values.items())).encode()


class Sysctl:
    name = "sysctl"

    def parse(self, settings: Mapping[str, Any]) -> dict[str, str]:
        return parse_values(settings)

    async def check(self, desired: dict[str, str], ctx: HostContext) -> None:
        return None

    async def drifted(self, desired: dict[str, str], record: Record, ctx: HostContext) -> bool:
        return await files_drifted(record, ctx.ops)

    async def apply(self, desired: dict[str, str], record: Record | None, ctx: HostContext) -> Applied:
        files = {DROP_IN: render(desired)}
        return await write_then_run(ctx.ops, files, record, [("sysctl", "-p", ctx.ops.host_path(DROP_IN))])

    async def remove(self, record: Record, ctx: HostContext) -> None:
        await ctx.ops.remove(DROP_IN)
        await ctx.ops.command("sysctl", "--system")
