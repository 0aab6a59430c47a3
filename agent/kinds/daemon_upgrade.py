"""`daemon.upgrade`: swap in a signed release and restart onto it (agent.upgrade.controller).

Self-terminating: the dispatcher journals `running` right before the swap,
and the process restarts in the middle of `run`. The outcome is settled by
the controller after the restart, from upgrade.json: SUCCEEDED on the new
binary's first Welcome, or FAILED `update-failed` from the old binary after a
rollback. Refusals (not newer than the release the node runs, another
platform or name, a version that failed before, a bad signature or digest, a
failed download, a binary whose `--version` is another version) return here,
before anything is swapped.
"""

from __future__ import annotations

from agent.kinds.base import InvalidPayload, KindContext, KindResult, TypedExecutor
from bc.pki import releases
from bc.protocol.pb import kinds_pb2

UPGRADE_LOCK = "daemon"


class DaemonUpgrade(TypedExecutor[kinds_pb2.DaemonUpgradeRequest]):
    name = "daemon.upgrade"
    request_type = kinds_pb2.DaemonUpgradeRequest

    def validate(self, request: kinds_pb2.DaemonUpgradeRequest) -> None:
        if not releases.VERSION_RE.fullmatch(request.version):
            raise InvalidPayload(f"{request.version!r} is not a release version")
        if request.sequence < 0:
            raise InvalidPayload("the release sequence is negative")
        # Every other signed field is checked with the signature (controller): a release signed the old way
        # then fails `bad-release` with a sentence saying to publish it again.

    def locks(self, request: kinds_pb2.DaemonUpgradeRequest) -> list[str]:
        return [UPGRADE_LOCK]

    async def execute(self, ctx: KindContext, request: kinds_pb2.DaemonUpgradeRequest) -> KindResult:
        from agent.upgrade.controller import NO_SLOTS, NO_SLOTS_MESSAGE

        if ctx.upgrader is None:
            return KindResult.failure(NO_SLOTS, NO_SLOTS_MESSAGE)
        result: KindResult = await ctx.upgrader.upgrade(ctx.command_id, request)
        return result
