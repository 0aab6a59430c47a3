"""`instance.snapshot` (bulk lane, not retry-safe): one instance's disk, and with `include_memory` its memory
state, as a tar with `meta.json`, hashed (SHA-256) and uploaded to a presigned https URL.

The work is `agent.instances.snapshots.Snapshots.take` over the node's runtime; this executor checks the
request and the spec first. A memory snapshot of an instance with passthrough GPUs or a read-write volume is
refused (`snapshot-refused`) before anything is touched, with the reference's sentence. The result carries
the digest and size, and the URL without its query (a presigned URL's signature is a credential).
"""

from __future__ import annotations

import logging

from agent.instances.runtime import RuntimeFailure
from agent.instances.snapshot_meta import SnapshotError, memory_refusal
from agent.instances.transfer import TransferError, check_https, shown
from agent.kinds.base import InvalidPayload, KindContext, KindResult, TypedExecutor
from bc.protocol import instance_rules
from bc.protocol.pb import kinds_pb2

log = logging.getLogger(__name__)

NO_RUNTIME = "no-runtime"
UNKNOWN_INSTANCE = "unknown-instance"
REFUSED = "snapshot-refused"
FAILED = "snapshot-failed"
UPLOAD_FAILED = "upload-failed"


class InstanceSnapshot(TypedExecutor[kinds_pb2.InstanceSnapshotRequest]):
    """Result: `{instance_id, include_memory, sha256, bytes, uploaded_to, status}`."""

    name = "instance.snapshot"
    request_type = kinds_pb2.InstanceSnapshotRequest

    def validate(self, request: kinds_pb2.InstanceSnapshotRequest) -> None:
        if not instance_rules.INSTANCE_ID.fullmatch(request.instance_id):
            raise InvalidPayload(f"{request.instance_id[:80]!r} is not an instance id")
        try:
            check_https(request.upload_url, "the upload URL")
        except TransferError as e:
            raise InvalidPayload(str(e)) from None

    def locks(self, request: kinds_pb2.InstanceSnapshotRequest) -> list[str]:
        return [f"instance:{request.instance_id}"]

    async def execute(self, ctx: KindContext, request: kinds_pb2.InstanceSnapshotRequest) -> KindResult:
        iid = request.instance_id
        if ctx.snapshots is None:
            return KindResult.failure(NO_RUNTIME, "this node runs no instance runtime that takes snapshots")
        spec = next((i for i in ctx.spec_instances() if i.id == iid), None)
        if spec is None:
            return KindResult.failure(UNKNOWN_INSTANCE, f"the node's spec names no instance {iid}")
        if spec.runtime != ctx.snapshots.runtime.name:
            return KindResult.failure(
                NO_RUNTIME, f"instance {iid} runs on runtime {spec.runtime}, which takes no snapshots"
            )
        if request.include_memory:
            refusal = memory_refusal(spec)
            if refusal is not None:
                return KindResult.failure(REFUSED, refusal)
        try:
            result = await ctx.snapshots.take(iid, request.include_memory, request.upload_url)
        except TransferError as e:
            return KindResult.failure(UPLOAD_FAILED, str(e), {"upload_url": shown(request.upload_url)})
        except (SnapshotError, RuntimeFailure) as e:
            return KindResult.failure(FAILED, f"snapshot of {iid}: {e}")
        except OSError as e:
            return KindResult.failure(FAILED, f"snapshot of {iid}: {e.strerror or e}")
        return KindResult.success(result, f"uploaded {result['bytes']} bytes, sha256 {result['sha256']}")
