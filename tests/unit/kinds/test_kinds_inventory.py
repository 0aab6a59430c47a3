"""inventory.refresh: its result, encoded once per inventory, is the bytes the dispatcher's encoding gave."""

from __future__ import annotations

from agent.hw.base import inventory_hash
from agent.kinds.base import KindResult
from agent.kinds.inventory_refresh import InventoryRefresh
from bc.protocol.canonical import canonical_json, message_to_dict
from bc.protocol.pb import kinds_pb2
from tests.unit.kinds.kind_helpers import FakeNode


def _as_before(node: FakeNode) -> bytes:
    """The result as the kind and the dispatcher made it before the encoding was kept."""
    inv = node.hw.inventory()
    return canonical_json({"inventory": message_to_dict(inv), "inventory_hash": inventory_hash(inv)}).encode()


async def test_the_result_is_the_canonical_json_of_the_inventory(node: FakeNode) -> None:
    result = await InventoryRefresh().run(node.ctx, kinds_pb2.InventoryRefreshRequest())
    assert result.ok and result.message == "8 GPUs"
    assert result.encoded == _as_before(node)
    assert result.result_bytes() == canonical_json(result.result).encode() == _as_before(node)


async def test_a_changed_inventory_is_encoded_anew(node: FakeNode) -> None:
    first = await InventoryRefresh().run(node.ctx, kinds_pb2.InventoryRefreshRequest())
    assert node.hw.mig.handle(["nvidia-smi", "-i", "0", "-mig", "1"]).returncode == 0  # GPU 0 now reports MIG mode
    second = await InventoryRefresh().run(node.ctx, kinds_pb2.InventoryRefreshRequest())
    assert second.encoded == _as_before(node) != first.encoded


def test_a_result_without_its_encoding_is_encoded_by_the_dispatcher() -> None:
    r = KindResult.success({"b": [1, 2], "a": "é"})
    assert r.result_bytes() == '{"a":"é","b":[1,2]}'.encode()
