"""A person's GPU cordons: `bc health gpu cordon` and `bc health gpu return` (docs/health.md, "Returning a GPU").

The reconciler cordons a GPU when it opens an episode and returns it when the episode ends well; a GPU it
quarantines stays out "for a person". These are that person's two writes:

* `cordon_gpu` keeps new holds off one GPU (a manual cordon: no episode, `cordoned_by` the operator). The
  reconciler leaves a manually cordoned GPU alone, as it does a quarantined one: no episode opens on it.
* `return_gpu` puts a quarantined or cordoned GPU back into placement. A GPU whose cordon belongs to an
  open episode is refused: the episode returns it when it ends. The `health.gpu.returned` event wakes the
  placement pass (`bc.control.capacity.placement_wake`) and the reconciler: a GPU returned while its
  condition still reads unhealthy is acted on again under the policy (the answer says so).

Neither releases a hold: a cordon only keeps new holds away (I5). `resolve_gpu` is the pure part: a GPU
named by its UUID or its index on the node.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from bc.control.base.bus import Bus
from bc.control.base.events import publish
from bc.control.health import conditions as cond
from bc.errors import Conflict, NotFound, UsageError
from bc.protocol.pb import admin_pb2
from bc.store import Row, Store, Tx
from bc.store import health as health_sql
from bc.store import nodes as nodes_sql

MAX_REASON = 500
MANUAL_PREFIX = "cordoned by "


def resolve_gpu(inventory: Mapping[str, Any], gpu: str, also: Iterable[str] = ()) -> str | None:
    """The UUID of the GPU `gpu` names on a node: a UUID its inventory (or `also`: the node's cordoned GPUs,
    which a GPU fallen off the bus may have left) lists, or an index into its inventory. None: no such GPU."""
    gpus = [g for g in inventory.get("gpus", []) if isinstance(g, Mapping)]
    uuids = [str(g.get("uuid", "")) for g in gpus]
    if gpu in uuids or gpu in set(also):
        return gpu
    if gpu.isdigit():
        for g in gpus:
            if str(g.get("index", 0)) == str(int(gpu)) and g.get("uuid"):  # protobuf JSON leaves index 0 out
                return str(g["uuid"])
    return None


def _check_reason(reason: str, *, required: bool) -> str:
    reason = reason.strip()
    if required and not reason:
        raise UsageError("say why with --reason: the cordon is kept with it, for whoever returns the GPU")
    if len(reason) > MAX_REASON:
        raise UsageError(f"the reason is longer than {MAX_REASON} characters")
    if any(ord(ch) < 32 for ch in reason):
        raise UsageError("the reason has a control character (a line break, a tab, an escape)")
    return reason


async def _node_gpu(tx: Tx, node_id: str, gpu: str) -> tuple[Row, str]:
    node = await nodes_sql.get(tx, node_id)
    if node is None:
        raise NotFound(f"no node {node_id}")
    inventory = json.loads(str(node["inventory"] or "{}"))
    cordoned = [str(c["gpu_uuid"]) for c in await health_sql.gpu_cordons(tx, node_id)]
    uuid = resolve_gpu(inventory, gpu, cordoned)
    if uuid is None:
        raise NotFound(f"node {node_id} has no GPU {gpu} (name it by its UUID or its index, as `bc nodes show` lists)")
    return node, uuid


def cordon_info(row: Row) -> admin_pb2.GpuCordonInfo:
    return admin_pb2.GpuCordonInfo(
        node_id=str(row["node_id"]),
        gpu_uuid=str(row["gpu_uuid"]),
        reason=str(row["reason"]),
        episode_id=str(row["episode_id"] or ""),
        quarantined=bool(row["quarantined"]),
        since_ms=int(row["since_ms"]),
    )


async def cordon_gpu(
    store: Store, bus: Bus | None, node_id: str, gpu: str, reason: str, by: str
) -> admin_pb2.GpuCordonChange:
    """Keep new holds off one GPU until a person returns it; `health.gpu.cordoned`."""
    reason = _check_reason(reason, required=True)
    now_ms = await store.now_ms()
    async with store.transaction() as tx:
        _, uuid = await _node_gpu(tx, node_id, gpu)
        before = await health_sql.gpu_cordon(tx, node_id, uuid)
        if before is not None:
            what = "quarantined" if before["quarantined"] else "cordoned"
            raise Conflict(f"GPU {uuid} of node {node_id} is already {what}: {before['reason']}")
        text = f"{MANUAL_PREFIX}{by or 'an operator'}: {reason}"
        await health_sql.cordon_gpu(tx, node_id, uuid, text, None, False, by, now_ms)
        data = {"node": node_id, "gpu": uuid, "reason": text, "manual": True, "operator": by}
        await publish(tx, bus, "health.gpu.cordoned", node_id, data, now_ms)
        row = await health_sql.gpu_cordon(tx, node_id, uuid)
    assert row is not None
    return admin_pb2.GpuCordonChange(node_id=node_id, gpu_uuid=uuid, cordon=cordon_info(row))


async def return_gpu(
    store: Store, bus: Bus | None, node_id: str, gpu: str, reason: str, by: str
) -> admin_pb2.GpuCordonChange:
    """Put a quarantined or cordoned GPU back into placement; `health.gpu.returned` with who and why."""
    reason = _check_reason(reason, required=False)
    now_ms = await store.now_ms()
    async with store.transaction() as tx:
        node, uuid = await _node_gpu(tx, node_id, gpu)
        row = await health_sql.gpu_cordon(tx, node_id, uuid)
        if row is None:
            raise Conflict(f"GPU {uuid} of node {node_id} is not cordoned: nothing to return")
        episode = await health_sql.open_episode_of(tx, node_id, uuid)
        if episode is not None:
            raise Conflict(
                f"GPU {uuid} of node {node_id} is in remediation (episode {episode['id']}, {episode['state']}):"
                " it returns when the episode ends"
            )
        await health_sql.return_gpu(tx, node_id, uuid)
        was = "quarantined" if row["quarantined"] else "cordoned"
        data = {"node": node_id, "gpu": uuid, "episode": str(row["episode_id"] or ""), "was": was, "reason": reason}
        data["operator"] = by
        await publish(tx, bus, "health.gpu.returned", node_id, data, now_ms)
    sick = next((c for c in cond.from_status(node_id, str(node["status"] or "{}")) if c.gpu == uuid), None)
    return admin_pb2.GpuCordonChange(
        node_id=node_id, gpu_uuid=uuid, cordon=cordon_info(row), still_sick=sick.reason if sick else ""
    )
