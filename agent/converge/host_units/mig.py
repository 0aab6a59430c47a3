"""`mig`: the MIG layout of each GPU, made with `nvidia-smi` (MIG mode, then GPU and compute instances).

Settings: `{"gpus": [{"gpu": 0, "instances": ["3g.40gb", "2g.20gb", "2g.20gb"]}, {"gpu": "GPU-…", "enabled": false}]}`.
`gpu` is an index or a GPU UUID; `instances` names profiles, each made as one
GPU instance with one full compute instance; `enabled: false` turns MIG mode
off (with no instances). A GPU the inventory does not have, a GPU without MIG,
a profile the GPU does not offer or a layout that does not fit
(agent.hw.mig_profiles) fails the unit before any command runs.

A GPU is changed only when its layout differs from the inventory's (mode, and
the profiles as a multiset): MIG mode on, destroy every compute and GPU
instance, create the new ones. A GPU with a hold on it (whole, a slot or a
MIG instance: the devices converger's CDI files) is not touched; the unit
waits (retryable) until the holds are released. A command that fails puts the
old layout back, best effort, and the pass retries. Removing the unit leaves
the layout as it is: bc stops managing it. On a real GPU, turning MIG mode on
may need a GPU reset, which `nvidia-smi` reports and the retry then finds done.
Under `--fake-hw` the same commands reach the fake MIG model
(agent.hw.fake_mig), whose inventory shows the new instances, so a `gpu.mig`
hold on one binds on the next devices pass.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from agent.converge.host_units.base import Applied, HostContext, Record, UnitInvalid
from agent.hw.mig_profiles import layout_problem
from bc.protocol.host_units import GpuLayout, parse_layouts
from bc.protocol.pb import common_pb2


class MigBusy(OSError):
    """A GPU whose layout must change has holds on it: retried once they are released."""


def resolve(layout: GpuLayout, inventory: common_pb2.Inventory) -> common_pb2.Gpu:
    for gpu in inventory.gpus:
        if gpu.index == layout.gpu or gpu.uuid == layout.gpu:
            return gpu
    raise UnitInvalid(f"mig: this node has no GPU {layout.gpu}")


def matches(layout: GpuLayout, gpu: common_pb2.Gpu) -> bool:
    if gpu.mig_enabled != layout.enabled:
        return False
    have = sorted(m.profile for m in gpu.mig_instances)
    gis = {m.gi for m in gpu.mig_instances}
    return have == sorted(layout.instances) and len(gis) == len(layout.instances)


def commands(index: int, layout_enabled: bool, instances: Sequence[str], mig_on: bool) -> list[list[str]]:
    """The nvidia-smi calls that take GPU `index` from any layout to this one."""
    i = str(index)
    argv: list[list[str]] = []
    if layout_enabled and not mig_on:
        argv.append(["nvidia-smi", "-i", i, "-mig", "1"])
    if mig_on or layout_enabled:
        argv += [["nvidia-smi", "mig", "-i", i, "-dci"], ["nvidia-smi", "mig", "-i", i, "-dgi"]]
    if layout_enabled and instances:
        argv.append(["nvidia-smi", "mig", "-i", i, "-cgi", ",".join(instances), "-C"])
    if not layout_enabled and mig_on:
        argv.append(["nvidia-smi", "-i", i, "-mig", "0"])
    return argv


class Mig:
    name = "mig"

    def parse(self, settings: Mapping[str, Any]) -> tuple[GpuLayout, ...]:
        return parse_layouts(settings)

    async def check(self, desired: tuple[GpuLayout, ...], ctx: HostContext) -> None:
        inv = await ctx.inventory()
        seen: set[str] = set()
        for layout in desired:
            gpu = resolve(layout, inv)
            if gpu.uuid in seen:
                raise UnitInvalid(f"mig: GPU {gpu.index} ({gpu.uuid}) appears twice")
            seen.add(gpu.uuid)
            if layout.enabled:
                problem = layout_problem(gpu.name, layout.instances)
                if problem:
                    raise UnitInvalid(f"mig: GPU {gpu.index}: {problem}")

    async def drifted(self, desired: tuple[GpuLayout, ...], record: Record, ctx: HostContext) -> bool:
        inv = await ctx.inventory()
        return not all(matches(layout, resolve(layout, inv)) for layout in desired)

    async def apply(self, desired: tuple[GpuLayout, ...], record: Record | None, ctx: HostContext) -> Applied:
        inv = await ctx.inventory()
        todo = [(layout, resolve(layout, inv)) for layout in desired]
        todo = [(layout, gpu) for layout, gpu in todo if not matches(layout, gpu)]
        held = await ctx.held_gpus() if todo else set()
        busy = [gpu.index for _, gpu in todo if gpu.uuid in held]
        if busy:
            raise MigBusy(f"mig: GPU {', '.join(map(str, busy))} has holds; its layout changes once they are released")
        for layout, gpu in todo:
            old = [m.profile for m in sorted(gpu.mig_instances, key=lambda m: (m.gi, m.ci)) if m.ci == 0]
            try:
                for argv in commands(gpu.index, layout.enabled, layout.instances, gpu.mig_enabled):
                    await ctx.ops.command(*argv)
            except OSError:
                await self._restore(ctx, gpu.index, gpu.mig_enabled, old)
                raise
        return Applied()

    async def _restore(self, ctx: HostContext, index: int, enabled: bool, old: Sequence[str]) -> None:
        now = resolve(GpuLayout(index, enabled, tuple(old)), await ctx.inventory())
        for argv in commands(index, enabled, old, now.mig_enabled):
            try:
                await ctx.ops.command(*argv)
            except OSError:
                return

    async def remove(self, record: Record, ctx: HostContext) -> None:
        return None
