"""`node.reboot`: self-terminating; the result is the node coming back with a new boot id.

On real hardware `run` never returns: the dispatcher journals the command
as started before calling it, and settles it when the agent rejoins in the
new boot. Only a fake node with an in-process reboot hook returns, with
the boot ids before and after.
"""

from __future__ import annotations

import logging

from agent.hw.base import ActionDisabled
from agent.kinds.base import ALL_GPUS, KindContext, KindResult, TypedExecutor
from bc.protocol.pb import kinds_pb2

log = logging.getLogger(__name__)

REBOOT_DISABLED = "reboot-disabled"
REBOOT_FAILED = "reboot-failed"


class NodeReboot(TypedExecutor[kinds_pb2.NodeRebootRequest]):
    name = "node.reboot"
    request_type = kinds_pb2.NodeRebootRequest

    def locks(self, request: kinds_pb2.NodeRebootRequest) -> list[str]:
        return [ALL_GPUS]

    async def execute(self, ctx: KindContext, request: kinds_pb2.NodeRebootRequest) -> KindResult:
        log.warning("event=node.reboot node=%s reason=%r boot_id=%s", ctx.node_id, request.reason, ctx.boot_id)
        try:
            done, message = await ctx.hw.reboot(allow=ctx.allow_reboot)
        except ActionDisabled as e:
            return KindResult.failure(REBOOT_DISABLED, str(e))
        if not done:
            return KindResult.failure(REBOOT_FAILED, message)
        boot_id = await ctx.offload(ctx.hw.boot_id)
        return KindResult.success({"previous_boot_id": ctx.boot_id, "boot_id": boot_id}, message)
