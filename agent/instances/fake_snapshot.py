"""The fake runtime's half of snapshots and the identity rebind (`--fake-hw`, unit tests).

It captures what a hypervisor would into the staging directory: a flat qcow2
header standing for the disk and a memory state naming the instance, so the
snapshot tar, its upload, download, checks and unpacking are the real ones.
Its guest is a compliant one: a rebind disk hot-added to a running domain is
answered at once with `BCREBOUND <nonce>` (`silent` makes it ignore the disk,
for tests of a guest that never answers).
"""

from __future__ import annotations

import shutil
import struct
from pathlib import Path

from agent.instances import rebind
from agent.instances.fake import FakeRuntime
from agent.instances.runtime import STOPPED, RuntimeFailure
from agent.instances.snapshot_meta import DISK, MEMORY, SnapshotError
from agent.instances.snapshots import Captured
from agent.offload import Offload


def flat_qcow2(size: int = 1 << 30) -> bytes:
    """A qcow2 version 3 header with no backing file, its extensions ended, in one 64 KiB cluster: what the
    restore's header check (agent.instances.qcow2) reads."""
    return qcow2_header(size=size)


def qcow2_header(
    version: int = 3, backing: int = 0, crypt: int = 0, incompatible: int = 0, size: int = 1 << 30
) -> bytes:
    """A qcow2 header in one 64 KiB cluster (a file the size of its header is truncated), with the fields the
    header check reads: a backing file's offset, the encryption method, the incompatible feature bits."""
    return (
        b"QFI\xfb"
        + struct.pack(">IQIIQIIQQIIQ", version, backing, 0, 16, size, crypt, 0, 0, 0, 0, 0, 0)
        + struct.pack(">QQQII", incompatible, 0, 0, 4, 104)
        + b"\0" * 8  # the end of the header extensions
    ).ljust(1 << 16, b"\0")


class FakeSnapshots:
    name = "qemu"

    def __init__(self, fake: FakeRuntime, root: Path, offload: Offload) -> None:
        self.fake = fake
        self.root = root
        self.offload = offload
        self.silent = False
        self.rebinds: list[tuple[str, str]] = []
        """(instance id, nonce) of every rebind disk the guest answered."""

    def instance_dir(self, instance_id: str) -> Path:
        return self.root / instance_id

    async def cpu_model(self) -> str:
        return "fake-cpu"

    async def capture(self, instance_id: str, include_memory: bool, staging: Path) -> Captured:
        d = self.fake.domain(instance_id)
        if d is None or not d.managed:
            raise RuntimeFailure(f"no domain {instance_id} of bc's")
        if include_memory and d.state == STOPPED:
            raise SnapshotError(f"instance {instance_id} is stopped: a memory snapshot needs it running or paused")
        await self.offload((staging / DISK).write_bytes, flat_qcow2())
        memory = staging / MEMORY if include_memory else None
        if memory is not None:
            await self.offload(memory.write_bytes, f"fake memory of {instance_id}\n".encode())
        return Captured(staging / DISK, memory, d.vcpus, d.memory_mib)

    async def attach_rebind(self, instance_id: str, image: Path) -> None:
        d = self.fake.domain(instance_id)
        if d is None or d.state == STOPPED:
            raise RuntimeFailure(f"domain {instance_id} is not running")
        if self.silent:
            return
        data = await self.offload(image.read_bytes)
        nonce = rebind.nonce_of(data)
        await self.offload(_answer, image, nonce)
        self.rebinds.append((instance_id, nonce))

    async def detach_rebind(self, instance_id: str) -> None:
        return None

    async def forget(self, keep: set[str]) -> None:
        """The restore directories of domains that are gone and that no spec names."""
        gone = [
            d for d in await self.offload(_dirs, self.root) if d.name not in keep and self.fake.domain(d.name) is None
        ]
        for d in gone:
            await self.offload(shutil.rmtree, d, True)


def _dirs(root: Path) -> list[Path]:
    return [d for d in root.iterdir() if d.is_dir() and not d.is_symlink()] if root.is_dir() else []


def _answer(image: Path, nonce: str) -> None:
    with image.open("r+b") as f:
        f.seek(rebind.IMAGE_BYTES - rebind.ANSWER_BYTES)
        f.write(rebind.answer(nonce))
