"""Snapshots on a node: taking one for `instance.snapshot`, and fetching one for an instance's `restore_from`.

Everything lives under `<data-dir>/snapshots/` (the data disk, never a tmpfs:
a memory state is the guest's whole memory):

* `upload-<id>/` and `upload-<id>.tar`: a snapshot being taken. The runtime
  captures the disk (and the memory state) into the directory, `snapshot_tar`
  writes the tar beside it, hashing, and `transfer.upload` PUTs it to the
  presigned URL. Both go when the command ends, and `clean_uploads` removes
  what a crash left (the bulk lane runs one command at a time).
* `restore-<sha256>.tar`: a downloaded snapshot, verified (its digest is the
  name) before it is renamed there from `.partial`. The download runs in the
  background; `status` answers ready, pending or failed, and a failure is
  reported for `retry_s` (a minute) before the next `status` tries again.
  `prune` deletes the ones no spec restores from any more.

The runtime's half (`SnapshotRuntime`): capture into a directory, where an
instance's files live (a restore unpacks there), its CPU model, and the
identity rebind disk's hot-add and removal.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from agent.instances import snapshot_tar
from agent.instances.snapshot_meta import DISK, MEMORY, SnapshotError, SnapshotMeta, check_restore
from agent.instances.transfer import Limits, TransferError, download, shown, upload
from agent.offload import Offload
from bc.runtime.aio import cancel_and_wait
from bc.runtime.files import atomic_write
from bc.seams.clock import Clock

log = logging.getLogger(__name__)

MARKER = "restored.json"
SHA256 = re.compile(r"[0-9a-f]{64}")
MAX_SNAPSHOT_BYTES = 4 << 40
RETRY_S = 60.0


@dataclass(frozen=True)
class Captured:
    """What a runtime captured into the staging directory."""

    disk: Path | None
    memory: Path | None
    vcpus: int
    memory_mib: int


class SnapshotRuntime(Protocol):
    name: str

    async def cpu_model(self) -> str: ...

    def instance_dir(self, instance_id: str) -> Path:
        """Where the instance's files are (a restore unpacks its disk and memory state there)."""
        ...

    async def capture(self, instance_id: str, include_memory: bool, staging: Path) -> Captured:
        """The disk (flattened) and, with memory, the VM state into `staging`; a running VM is paused for it
        and resumed after. SnapshotError (or RuntimeFailure) says why not."""
        ...

    async def attach_rebind(self, instance_id: str, image: Path) -> None: ...

    async def detach_rebind(self, instance_id: str) -> None: ...

    async def forget(self, keep: set[str]) -> None:
        """Remove what the adapter keeps of instances whose domain is gone and which no spec names (qemu keeps
        nothing outside the domain's directory, which its delete removes)."""
        ...


@dataclass(frozen=True)
class Restored:
    """The marker a restore leaves in the instance's directory: what it came from."""

    sha256: str
    include_memory: bool


@dataclass(frozen=True)
class Fetch:
    """A restore's snapshot as `status` sees it: `path` when ready, `error` when it failed; neither: pending."""

    path: Path | None = None
    error: str = ""


class Snapshots:
    def __init__(
        self,
        root: Path,
        runtime: SnapshotRuntime,
        offload: Offload,
        clock: Clock,
        *,
        rng: random.Random,
        ca_pem: bytes = b"",
        limits: Limits = Limits(),
        retry_s: float = RETRY_S,
        wake: Callable[[], None] = lambda: None,
    ) -> None:
        self.root = root
        self.runtime = runtime
        self.offload = offload
        self.clock = clock
        self.rng = rng
        self.ca_pem = ca_pem
        self.limits = limits
        self.retry_s = retry_s
        self.wake = wake
        """Called when a download ends, so the converger's next pass does not wait for its timer."""
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._failed: dict[str, tuple[str, str, float]] = {}  # sha -> (url, why, when)
        self._taking: set[str] = set()  # the staging names of the snapshots being taken now

    # -- taking one (instance.snapshot) ----------------------------------------
    async def clean_uploads(self) -> None:
        """Remove what a crash left of snapshots being taken (never one being taken now)."""
        await self.offload(_remove_matching, self.root, "upload-*", frozenset(self._taking))

    async def take(self, instance_id: str, include_memory: bool, url: str) -> dict[str, object]:
        """Capture, tar, hash, upload; the command's result. SnapshotError / TransferError / RuntimeFailure."""
        await self.clean_uploads()
        name = f"upload-{self.rng.getrandbits(64):016x}"
        staging, tar = self.root / name, self.root / f"{name}.tar"
        self._taking.add(name)
        try:
            await self.offload(staging.mkdir, mode=0o700, parents=True)
            got = await self.runtime.capture(instance_id, include_memory, staging)
            meta = SnapshotMeta(
                runtime=self.runtime.name,
                cpu_model=await self.runtime.cpu_model(),
                include_memory=include_memory,
                vcpus=got.vcpus,
                memory_mib=got.memory_mib,
                disk=got.disk is not None,
            )
            sha, size = await self.offload(snapshot_tar.build, tar, meta, got.disk, got.memory)
            await self.offload(_remove_tree, staging)  # the tar holds it all: free the space before the upload
            log.info("event=instance.snapshot-taken instance=%s memory=%s bytes=%d", instance_id, include_memory, size)
            status = await upload(
                tar, url, ca_pem=self.ca_pem, limits=self.limits, clock=self.clock, offload=self.offload
            )
        finally:
            await self.offload(_remove_tree, staging)
            await self.offload(tar.unlink, missing_ok=True)
            self._taking.discard(name)
        log.info("event=instance.snapshot-uploaded instance=%s url=%s bytes=%d", instance_id, shown(url), size)
        return {
            "instance_id": instance_id,
            "include_memory": include_memory,
            "sha256": sha,
            "bytes": size,
            "uploaded_to": shown(url),
            "status": status,
        }

    # -- fetching one (restore_from) -------------------------------------------
    def _path(self, sha: str) -> Path:
        return self.root / f"restore-{sha}.tar"

    async def status(self, url: str, sha: str) -> Fetch:
        """Ready, pending (a download is started if none runs) or failed (for `retry_s` after the failure)."""
        if not SHA256.fullmatch(sha):
            return Fetch(error=f"the snapshot's sha256 {sha[:80]!r} is not 64 lowercase hex digits")
        path = self._path(sha)
        if await self.offload(path.is_file):
            return Fetch(path=path)
        if sha in self._tasks:
            return Fetch()
        failed = self._failed.get(sha)
        if failed is not None and failed[0] == url and self.clock.monotonic() < failed[2] + self.retry_s:
            return Fetch(error=failed[1])  # reported for a while; a spec naming another URL tries that at once
        self._failed.pop(sha, None)
        self._tasks[sha] = asyncio.create_task(self._download(url, sha), name=f"snapshot-download-{sha[:12]}")
        return Fetch()

    async def _download(self, url: str, sha: str) -> None:
        partial = self.root / f"restore-{sha}.partial"
        try:
            await self.offload(self.root.mkdir, mode=0o700, parents=True, exist_ok=True)
            got, size = await download(
                url,
                partial,
                max_size=MAX_SNAPSHOT_BYTES,
                ca_pem=self.ca_pem,
                limits=self.limits,
                clock=self.clock,
                offload=self.offload,
            )
            if got != sha:
                await self.offload(partial.unlink, missing_ok=True)
                raise TransferError(f"the snapshot at {shown(url)} has sha256 {got}, not the spec's {sha}")
            await self.offload(partial.replace, self._path(sha))
            log.info("event=instance.snapshot-downloaded sha256=%s bytes=%d", sha, size)
        except TransferError as e:
            self._failed[sha] = (url, f"snapshot download: {e}", self.clock.monotonic())
            log.warning("event=instance.snapshot-download-failed sha256=%s error=%r", sha, str(e))
        except OSError as e:
            self._failed[sha] = (url, f"snapshot download: {e.strerror or e}", self.clock.monotonic())
        finally:
            self._tasks.pop(sha, None)
            self.wake()

    async def prune(self, keep: set[str]) -> None:
        """Delete the downloaded snapshots (and stop the downloads) no spec restores from."""
        for sha, task in list(self._tasks.items()):
            if sha not in keep:
                task.cancel()
        for sha in list(self._failed):
            if sha not in keep:
                del self._failed[sha]
        await self.offload(_prune, self.root, keep)

    async def forget(self, named: set[str]) -> None:
        await self.runtime.forget(named)

    async def close(self) -> None:
        await cancel_and_wait(list(self._tasks.values()))

    # -- restoring into an instance --------------------------------------------
    async def peek(self, path: Path, vcpus: int, memory_mib: int) -> SnapshotMeta:
        """The snapshot's meta.json, checked against this host and the instance (SnapshotError)."""
        meta = await self.offload(_read_meta, path)
        self.check(meta, await self.runtime.cpu_model(), vcpus, memory_mib)
        return meta

    def check(self, meta: SnapshotMeta, cpu_model: str, vcpus: int, memory_mib: int) -> None:
        check_restore(meta, self.runtime.name, cpu_model, vcpus, memory_mib)

    def disk_path(self, instance_id: str) -> Path:
        return self.runtime.instance_dir(instance_id) / DISK

    async def restored(self, instance_id: str) -> Restored | None:
        """The instance's restore marker, if it was restored."""
        try:
            doc = json.loads(await self.offload((self.runtime.instance_dir(instance_id) / MARKER).read_bytes))
            return Restored(str(doc["sha256"]), bool(doc["include_memory"]))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    async def restore_into(self, instance_id: str, sha: str, vcpus: int, memory_mib: int) -> SnapshotMeta:
        """Unpack the downloaded snapshot into the instance's directory (its disk checked), and mark it."""
        cpu = await self.runtime.cpu_model()
        into = self.runtime.instance_dir(instance_id)
        await self.offload(into.mkdir, mode=0o700, parents=True, exist_ok=True)
        try:
            meta = await self.offload(
                snapshot_tar.unpack, self._path(sha), into, lambda m: self.check(m, cpu, vcpus, memory_mib)
            )
        except BaseException:
            for name in (DISK, MEMORY):
                await self.offload((into / name).unlink, missing_ok=True)
            raise
        marker = json.dumps({"sha256": sha, "include_memory": meta.include_memory}).encode()
        await self.offload(atomic_write, into / MARKER, marker, 0o600)
        log.info("event=instance.restored instance=%s sha256=%s memory=%s", instance_id, sha, meta.include_memory)
        return meta


def _read_meta(path: Path) -> SnapshotMeta:
    import tarfile

    from agent.instances.snapshot_meta import MAX_META_BYTES, META, parse_meta

    try:
        with tarfile.open(path, mode="r:") as tar:
            first = tar.next()
            if first is None or first.name != META or not first.isreg():
                raise SnapshotError(f"the snapshot does not start with {META}")
            f = tar.extractfile(first)
            assert f is not None
            return parse_meta(f.read(MAX_META_BYTES + 1))
    except tarfile.TarError as e:
        raise SnapshotError(f"the snapshot is not a tar: {e}") from None


def _remove_tree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def _remove_matching(root: Path, pattern: str, spare: frozenset[str]) -> None:
    if not root.is_dir():
        return
    for p in root.glob(pattern):
        if p.name.removesuffix(".tar") in spare:
            continue
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)


def _prune(root: Path, keep: set[str]) -> None:
    if not root.is_dir():
        return
    for p in root.glob("restore-*"):
        sha = p.name.removeprefix("restore-").split(".")[0]
        if sha not in keep:
            p.unlink(missing_ok=True)
