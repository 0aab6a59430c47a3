"""`hugepages`: huge page pools per size and NUMA node, set through sysfs.

Settings: `{"pages": [{"size": "1G", "count": 8, "numa_node": 0}, {"size": "2M", "count": 1024}]}`.
A size is `<n>kB`, `<n>K`, `<n>M` or `<n>G`; one without `numa_node` sets the
host-wide pool (`sys/kernel/mm/hugepages/hugepages-<kB>kB/nr_hugepages`), one
with it that node's (`sys/devices/system/node/node<N>/hugepages/…`). A size
the host does not offer (no such sysfs directory) or a NUMA node it does not
have fails the unit before anything is written. Applying records each pool's
value before the first write, writes the counts and reads them back: the
kernel may give fewer pages than asked (fragmented memory), and then every
pool goes back to its old value and the pass retries. Removing the unit puts
the recorded old values back. Drift is a pool that no longer holds its count.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agent.converge.host_units.base import Applied, HostContext, Record, UnitInvalid
from bc.protocol.host_units import Pool, parse_pools


def pool_dir(size: int, node: int | None) -> str:
    if node is None:
        return f"sys/kernel/mm/hugepages/hugepages-{size}kB"
    return f"sys/devices/system/node/node{node}/hugepages/hugepages-{size}kB"


def pool_file(pool: Pool) -> str:
    return pool_dir(*pool) + "/nr_hugepages"


def _key(pool: Pool) -> str:
    return f"{pool[0]}kB@{'all' if pool[1] is None else pool[1]}"


def _unkey(key: str) -> Pool:
    size, _, node = key.partition("kB@")
    return int(size), None if node == "all" else int(node)


async def _read_count(ctx: HostContext, pool: Pool) -> int | None:
    data = await ctx.ops.read(pool_file(pool))
    if data is None:
        return None
    try:
        return int(data.decode().strip() or "0")
    except ValueError:
        return None


class HugePages:
    name = "hugepages"

    def parse(self, settings: Mapping[str, Any]) -> dict[Pool, int]:
        return parse_pools(settings)

    async def check(self, desired: dict[Pool, int], ctx: HostContext) -> None:
        for size, node in desired:
            if node is not None and not await ctx.ops.is_dir(f"sys/devices/system/node/node{node}"):
                raise UnitInvalid(f"hugepages: this host has no NUMA node {node}")
            if not await ctx.ops.is_dir(pool_dir(size, node)):
                raise UnitInvalid(f"hugepages: this host does not support {size} kB huge pages")

    async def drifted(self, desired: dict[Pool, int], record: Record, ctx: HostContext) -> bool:
        for pool, count in desired.items():
            if await _read_count(ctx, pool) != count:
                return True
        return False

    async def apply(self, desired: dict[Pool, int], record: Record | None, ctx: HostContext) -> Applied:
        # Undo values: kept from the first apply (what the host had before bc), new pools read now.
        undo: dict[str, int] = dict(record.undo.get("pools", {})) if record is not None else {}
        before: dict[Pool, int] = {}
        for pool in desired:
            now = await _read_count(ctx, pool)
            before[pool] = now or 0
            undo.setdefault(_key(pool), now or 0)
        dropped = [_unkey(k) for k in sorted(undo) if _unkey(k) not in desired]
        written: list[Pool] = []
        try:
            for pool in dropped:  # a pool the new settings no longer name goes back to its old value
                before[pool] = await _read_count(ctx, pool) or 0
                await ctx.ops.write_sysfs(pool_file(pool), str(undo[_key(pool)]))
                written.append(pool)
            for pool, count in desired.items():
                await ctx.ops.write_sysfs(pool_file(pool), str(count))
                written.append(pool)
                got = await _read_count(ctx, pool)
                if got != count:
                    raise OSError(f"hugepages: asked for {count} {pool[0]} kB pages, the kernel gave {got}")
        except OSError:
            for pool in reversed(written):
                try:
                    await ctx.ops.write_sysfs(pool_file(pool), str(before[pool]))
                except OSError:
                    continue
            raise
        for pool in dropped:
            del undo[_key(pool)]
        return Applied(undo={"pools": undo})

    async def remove(self, record: Record, ctx: HostContext) -> None:
        for key, value in sorted(record.undo.get("pools", {}).items()):
            pool = _unkey(key)
            if await ctx.ops.is_dir(pool_dir(*pool)):
                await ctx.ops.write_sysfs(pool_file(pool), str(value))
