"""`diag.dcgm`: NVIDIA DCGM's diagnostics (`dcgmi diag -r LEVEL -j`), when DCGM is installed.

Level 1 is a quick, passive check; from level 2 the tests load the GPUs
hard enough to disturb a workload, so they apply gpu.reset's live-hold
check first. DCGM is never faked: without `dcgmi` the command says so.
"""

from __future__ import annotations

import json
import shutil
from typing import Any

from agent.hw.base import run_process
from agent.instances.passthrough import RECORDS_DIR
from agent.kinds.base import (
    ALL_GPUS,
    DCGM_NOT_INSTALLED,
    InvalidPayload,
    KindContext,
    KindResult,
    TypedExecutor,
    check_gpu_uuids,
    gpu_lock,
)
from agent.kinds.holds import busy_failure
from bc.protocol import kinds as kind_table
from bc.protocol.pb import kinds_pb2

DCGMI = "dcgmi"
DCGM_FAILED = "dcgm-failed"
UNKNOWN_GPU = "unknown-gpu"
TAIL_BYTES = 4000


class DiagDcgm(TypedExecutor[kinds_pb2.DiagDcgmRequest]):
    """Result: `level`, `gpu_ids`, `exit_code` and `report` (dcgmi's JSON) or `stdout_tail` when it is not JSON."""

    name = "diag.dcgm"
    request_type = kinds_pb2.DiagDcgmRequest

    def validate(self, request: kinds_pb2.DiagDcgmRequest) -> None:
        if not 1 <= request.level <= 4:
            raise InvalidPayload(f"level is {request.level}; dcgmi diag levels are 1-4")
        check_gpu_uuids(request.gpu_uuids)

    def locks(self, request: kinds_pb2.DiagDcgmRequest) -> list[str]:
        uuids = check_gpu_uuids(request.gpu_uuids)
        return [gpu_lock(u) for u in uuids] if uuids else [ALL_GPUS]

    async def execute(self, ctx: KindContext, request: kinds_pb2.DiagDcgmRequest) -> KindResult:
        dcgmi = shutil.which(DCGMI)
        if dcgmi is None:
            return KindResult.failure(
                DCGM_NOT_INSTALLED,
                "dcgmi is not on PATH: install NVIDIA DCGM (datacenter-gpu-manager) to run diag.dcgm",
            )
        uuids = check_gpu_uuids(request.gpu_uuids)
        if request.level >= 2:
            busy = await busy_failure(
                ctx.cdi_dir, set(uuids) if uuids else None, ctx.offload, ctx.data_dir / RECORDS_DIR
            )
            if busy is not None:
                return busy
        argv = [dcgmi, "diag", "-r", str(request.level), "-j"]
        gpu_ids: list[int] = []
        if uuids:
            index = {g.uuid: g.index for g in (await ctx.offload(ctx.hw.inventory)).gpus}
            unknown = [u for u in uuids if u not in index]
            if unknown:
                return KindResult.failure(UNKNOWN_GPU, f"no GPU {', '.join(unknown)} on this node")
            gpu_ids = [index[u] for u in uuids]
            argv += ["-i", ",".join(str(i) for i in gpu_ids)]
        try:
            res = await run_process(argv, timeout_s=kind_table.timeout_s(self.name))
        except TimeoutError:
            return KindResult.failure(DCGM_FAILED, "dcgmi diag did not finish in time")
        result: dict[str, Any] = {"level": request.level, "gpu_ids": gpu_ids, "exit_code": res.returncode}
        try:
            result["report"] = json.loads(res.stdout)
        except ValueError:
            result["stdout_tail"] = res.stdout[-TAIL_BYTES:].decode("utf-8", "replace")
        if res.returncode != 0:
            return KindResult.failure(DCGM_FAILED, f"dcgmi diag exited {res.returncode}: {res.tail(500)}", result)
        return KindResult.success(result, f"dcgmi diag -r {request.level} passed")
