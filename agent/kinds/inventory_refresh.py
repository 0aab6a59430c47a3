"""`inventory.refresh`: read the hardware again and report it, so the control plane need not wait for a restart."""

from __future__ import annotations

import asyncio
import functools
from typing import Any

from agent.hw.base import inventory_hash
from agent.kinds.base import KindContext, KindResult, TypedExecutor
from bc.protocol.canonical import canonical_json, message_to_dict
from bc.protocol.pb import common_pb2, kinds_pb2


class InventoryRefresh(TypedExecutor[kinds_pb2.InventoryRefreshRequest]):
    """Result: `inventory` (protobuf JSON) and `inventory_hash` (the hash the session reports carry)."""

    name = "inventory.refresh"
    request_type = kinds_pb2.InventoryRefreshRequest

    async def execute(self, ctx: KindContext, request: kinds_pb2.InventoryRefreshRequest) -> KindResult:
        delay = float(getattr(ctx.hw, "refresh_seconds", 0.0))  # a fake backend may simulate a slow enumeration
        if delay > 0:
            await asyncio.sleep(delay)
        inv = await ctx.offload(ctx.hw.inventory)
        result, encoded = _result_of(inv.SerializeToString(deterministic=True))
        return KindResult(ok=True, message=f"{len(inv.gpus)} GPUs", result=result, encoded=encoded)


@functools.lru_cache(maxsize=4096)  # one entry per distinct inventory: a host has one, a simulator thousands
def _result_of(wire: bytes) -> tuple[dict[str, Any], bytes]:
    """The result of an inventory, as a dict and as the canonical JSON the dispatcher stores, by the inventory's
    deterministic bytes: a host's inventory rarely changes, and protobuf's JSON of it was the kind's whole cost.

    The dict is shared by every result of the same inventory: read it, never change it."""
    inv = common_pb2.Inventory()
    inv.ParseFromString(wire)
    result = {"inventory": message_to_dict(inv), "inventory_hash": inventory_hash(inv)}
    return result, canonical_json(result).encode()
