"""`gpu.reset`: reset listed GPUs, never one a live hold is using or one passed through to a VM.

The reference's order matters: every check runs before anything is
touched, so a command naming one busy GPU resets none (a half-done reset
of a batch is harder to reason about than a refusal). After the resets a
fresh inventory and the diag counters say whether each reset GPU is healthy
again: no uncorrectable volatile ECC errors, no pending or failed remap. The
health monitor reads the GPUs again too (`ctx.after_gpu_reset`): one that
reads healthy loses its XID conditions at once (docs/health.md).
"""

from __future__ import annotations

import logging
from typing import Any

from agent.hw.base import UNKNOWN_GPU, diag_healthy, inventory_hash
from agent.instances.passthrough import RECORDS_DIR
from agent.kinds.base import InvalidPayload, KindContext, KindResult, TypedExecutor, check_gpu_uuids, gpu_lock
from agent.kinds.holds import busy_failure
from bc.protocol.canonical import message_to_dict
from bc.protocol.pb import kinds_pb2

log = logging.getLogger(__name__)


class GpuReset(TypedExecutor[kinds_pb2.GpuResetRequest]):
    """Result: `gpus` ([{uuid, reset, message, healthy?}] in request order), `inventory` and `inventory_hash`."""

    name = "gpu.reset"
    request_type = kinds_pb2.GpuResetRequest

    def validate(self, request: kinds_pb2.GpuResetRequest) -> None:
        if not request.gpu_uuids:
            raise InvalidPayload("gpu_uuids is empty: name the GPUs to reset")
        check_gpu_uuids(request.gpu_uuids)

    def locks(self, request: kinds_pb2.GpuResetRequest) -> list[str]:
        return [gpu_lock(u) for u in check_gpu_uuids(request.gpu_uuids)]

    async def execute(self, ctx: KindContext, request: kinds_pb2.GpuResetRequest) -> KindResult:
        uuids = check_gpu_uuids(request.gpu_uuids)
        busy = await busy_failure(ctx.cdi_dir, set(uuids), ctx.offload, ctx.data_dir / RECORDS_DIR)
        if busy is not None:
            return busy
        known = {g.uuid for g in (await ctx.offload(ctx.hw.inventory)).gpus}

        entries: list[dict[str, Any]] = []
        for u in uuids:
            if u not in known:
                entries.append({"uuid": u, "reset": False, "message": UNKNOWN_GPU})
                continue
            done, message = await ctx.hw.reset_gpu(u, allow=ctx.allow_gpu_reset)
            log.info("event=gpu.reset uuid=%s done=%s message=%r", u, done, message)
            entries.append({"uuid": u, "reset": done, "message": message})

        inv = await ctx.offload(ctx.hw.inventory)
        reset = [e["uuid"] for e in entries if e["reset"]]
        if reset:
            diag = await ctx.offload(ctx.hw.diag, reset)
            inventory_healthy = {g.uuid: g.healthy for g in inv.gpus}
            for e in entries:
                if e["reset"]:
                    e["healthy"] = inventory_healthy.get(e["uuid"], False) and diag_healthy(diag.get(e["uuid"], {}))
            if ctx.after_gpu_reset is not None:
                # The health monitor reads again: a GPU that reads healthy loses its XID conditions at once.
                verdicts = await ctx.after_gpu_reset(reset)
                for e in entries:
                    if e["reset"]:
                        e["healthy"] = e["healthy"] and verdicts.get(e["uuid"], False)
        return KindResult.success(
            {"gpus": entries, "inventory": message_to_dict(inv), "inventory_hash": inventory_hash(inv)},
            f"reset {len(reset)} of {len(uuids)} GPUs",
        )
