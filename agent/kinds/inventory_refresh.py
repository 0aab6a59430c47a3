"""`inventory.refresh`: read the hardware again and report it, so the control plane need not wait for a restart."""

from __future__ import annotations

import asyncio

from agent.hw.base import inventory_hash
from agent.kinds.base import KindContext, KindResult, TypedExecutor
from bc.protocol.canonical import message_to_dict
from bc.protocol.pb import kinds_pb2


class InventoryRefresh(TypedExecutor[kinds_pb2.InventoryRefreshRequest]):
    """Result: `inventory` (protobuf JSON) and `inventory_hash` (the hash the session reports carry)."""

    name = "inventory.refresh"
    request_type = kinds_pb2.InventoryRefreshRequest

    async def execute(self, ctx: KindContext, request: kinds_pb2.InventoryRefreshRequest) -> KindResult:
        delay = float(getattr(ctx.hw, "refresh_seconds", 0.0))  # a fake backend may simulate a slow enumeration
        if delay > 0:
            await asyncio.sleep(delay)
        inv = await ctx.offload(ctx.hw.inventory)
        return KindResult.success(
            {"inventory": message_to_dict(inv), "inventory_hash": inventory_hash(inv)},
            f"{len(inv.gpus)} GPUs",
        )
