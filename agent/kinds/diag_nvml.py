"""`diag.nvml`: each GPU's health counters (ECC, retired pages, row remapping, XIDs, clocks, heat, power).

Read-only, so it takes no locks: it may run beside anything, and a counter
NVML cannot read while a GPU is busy or resetting comes back null rather
than failing the command.
"""

from __future__ import annotations

from agent.kinds.base import KindContext, KindResult, TypedExecutor
from bc.protocol.pb import kinds_pb2


class DiagNvml(TypedExecutor[kinds_pb2.DiagNvmlRequest]):
    """Result: `gpus` (UUID → entry; `{"error": "unknown GPU"}` for a UUID the node lacks) and `healthy` (all are)."""

    name = "diag.nvml"
    request_type = kinds_pb2.DiagNvmlRequest

    async def execute(self, ctx: KindContext, request: kinds_pb2.DiagNvmlRequest) -> KindResult:
        uuids = list(dict.fromkeys(request.gpu_uuids))
        gpus = await ctx.offload(ctx.hw.diag, uuids)
        healthy = all(bool(entry.get("healthy")) for entry in gpus.values())
        unhealthy = sorted(u for u, entry in gpus.items() if not entry.get("healthy"))
        message = f"{len(gpus)} GPUs, all healthy" if healthy else f"not healthy: {', '.join(unhealthy)}"
        return KindResult.success({"gpus": gpus, "healthy": healthy}, message)
