"""`boot.kexec` (ramdisk role; control lane; self-terminating): boot the installed OS from the deployed disk.

The disk and partition are read back first (sfdisk, as deploy.image checked them): a disk /sys/block does not
know is `unknown-disk`, a partition its table does not list `no-such-partition`. Then the kexec edge
(agent.ramdisk.kexec) loads the kernel and jumps: on success this command never reports, since the
ramdisk, its process and its journal are gone; the next boot is the installed OS, which joins as a
`node` with an identity of its own. What the control plane makes of a command whose node never comes
back, or comes back with a new journal, is the reference's and is written in docs/metal-ramdisk.md.
A kexec that could not start is `kexec-failed`, and the ramdisk stays.
"""

from __future__ import annotations

import logging
import posixpath

from agent.kinds.base import INTERNAL, InvalidPayload, KindContext, KindResult, TypedExecutor
from agent.kinds.disk_wipe import disk_lock
from agent.ramdisk import image_check
from agent.ramdisk.kexec import KexecPlan
from agent.ramdisk.machine import DiskError, find_disk
from bc.protocol.pb import kinds_pb2

log = logging.getLogger(__name__)

KEXEC_FAILED = "kexec-failed"
NO_SUCH_PARTITION = "no-such-partition"
MAX_CMDLINE = 2048


def _check_path(field: str, path: str, required: bool) -> None:
    if not path:
        if required:
            raise InvalidPayload(f"{field} is empty: give the path inside the boot partition")
        return
    if not path.startswith("/") or posixpath.normpath(path) != path or len(path) > 255:
        raise InvalidPayload(f"{field} {path[:80]!r} must be an absolute, normalised path inside the partition")


class BootKexec(TypedExecutor[kinds_pb2.BootKexecRequest]):
    name = "boot.kexec"
    request_type = kinds_pb2.BootKexecRequest

    def validate(self, request: kinds_pb2.BootKexecRequest) -> None:
        if not request.disk:
            raise InvalidPayload("disk is empty: name the disk the image was deployed to")
        if request.partition < 1:
            raise InvalidPayload(f"partition is {request.partition}; partitions count from 1")
        _check_path("kernel", request.kernel, True)
        _check_path("initrd", request.initrd, False)
        if len(request.cmdline) > MAX_CMDLINE or any(c in request.cmdline for c in "\n\r\0"):
            raise InvalidPayload(f"cmdline must be one line of at most {MAX_CMDLINE} characters")

    def locks(self, request: kinds_pb2.BootKexecRequest) -> list[str]:
        return [disk_lock(request.disk)]

    async def execute(self, ctx: KindContext, request: kinds_pb2.BootKexecRequest) -> KindResult:
        tree, kexec = ctx.machine, ctx.kexec
        if tree is None or kexec is None:
            return KindResult.failure(INTERNAL, "this agent has no kexec edge: boot.kexec runs on a ramdisk")
        try:
            await ctx.offload(find_disk, tree, request.disk, writable=False)
            table = await image_check.check_image(tree.device(request.disk))
        except DiskError as e:
            return KindResult.failure(e.code, e.message)
        except image_check.CheckError as e:
            return KindResult.failure(KEXEC_FAILED, str(e))
        except TimeoutError:
            return KindResult.failure(KEXEC_FAILED, f"the partition table of {request.disk} could not be read in time")
        part = next((p for p in table.partitions if p["number"] == request.partition), None)
        if part is None:
            return KindResult.failure(
                NO_SUCH_PARTITION,
                f"disk {request.disk} has no partition {request.partition} ({len(table.partitions)} listed)",
            )
        plan = KexecPlan(
            device=str(tree.device(request.disk)),
            offset_bytes=int(part["start_bytes"]),
            size_bytes=int(part["size_bytes"]),
            kernel=request.kernel,
            initrd=request.initrd,
            cmdline=request.cmdline,
        )
        log.warning("event=boot.kexec disk=%s partition=%d kernel=%s", request.disk, request.partition, request.kernel)
        why = await kexec.boot(plan, gone=ctx.gone)
        return KindResult.failure(KEXEC_FAILED, why, {"disk": request.disk, "partition": request.partition})
