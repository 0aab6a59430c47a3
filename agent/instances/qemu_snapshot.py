"""qemu's half of snapshots, restores and the identity rebind, over QMP (agent.instances.snapshots).

* **capture**: a running VM is paused (`stop`, which drains its I/O); with
  memory, its state is written with `migrate` to `fd:bc-state`, a file the
  agent opened and handed over with `getfd` (qemu runs as its own user and may
  open nothing of the agent's), followed on `query-migrate` until it completes; the
  disk is flattened with `qemu-img convert -U -O qcow2` (the VM holds its lock,
  and it is paused, so the copy is consistent with the state); then `cont`.
  A paused VM stays paused.
* **a memory restore's first start**: when the instance's directory holds
  `memory.state` (a restore unpacked it), qemu starts with `-incoming defer`
  and `-S`, is fed the state with `migrate-incoming` from `fd:bc-state` (the
  file opened by the agent, handed over with `getfd`),
  and once it has arrived, `cont` (unless the start is a paused one); the
  state file is then removed, so a later start is a boot of the restored disk.
* **rebind**: the raw disk, opened by the agent and handed over as fd set 7
  (`add-fd`), is hot-added with `blockdev-add` of `/dev/fdset/7` (node
  `bc-rebind`) and `device_add virtio-blk-pci` with serial `bc-rebind`;
  removed with `device_del`, `blockdev-del` and `remove-fd`.
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path
from typing import Any

from agent.instances.qemu import QMP_SOCKET, QemuRuntime
from agent.instances.qmp import QmpClient, QmpError
from agent.instances.rebind import SERIAL
from agent.instances.runtime import STOPPED, RuntimeFailure, record_config
from agent.instances.snapshot_meta import DISK, MEMORY, SnapshotError
from agent.instances.snapshots import Captured
from agent.instances.tool import ToolFailed, run_tool

STATE_FD = "bc-state"
REBIND_FDSET = 7
"""The fd set the rebind disk is handed over in (one rebind disk per guest at a time)."""
log = logging.getLogger(__name__)

QEMU_IMG = "qemu-img"
MIGRATE_POLL_S = 0.1


class QemuSnapshots:
    name = "qemu"

    def __init__(self, runtime: QemuRuntime, *, qemu_img: str = QEMU_IMG, migrate_s: float = 3600.0) -> None:
        self.runtime = runtime
        self.qemu_img = qemu_img
        self.migrate_s = migrate_s
        self._cpu: str | None = None
        runtime.incoming = self  # its start asks this for a memory restore's -incoming

    def instance_dir(self, instance_id: str) -> Path:
        return self.runtime.root / instance_id

    async def cpu_model(self) -> str:
        """The host's CPU model (`model name` of /proc/cpuinfo): a memory snapshot restores only on the same."""
        if self._cpu is None:
            text = await self.runtime.offload(Path("/proc/cpuinfo").read_text)
            self._cpu = next(
                (line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name")),
                "unknown",
            )
        return self._cpu

    async def _connect(self, instance_id: str) -> QmpClient:
        try:
            return await QmpClient.connect(self.instance_dir(instance_id) / QMP_SOCKET, self.runtime.qmp_timeout_s)
        except (OSError, QmpError):
            raise RuntimeFailure(f"domain {instance_id} is not running") from None

    async def capture(self, instance_id: str, include_memory: bool, staging: Path) -> Captured:
        config = record_config(await self.runtime._record(instance_id))
        state = await self.runtime._status(instance_id)
        memory = staging / MEMORY if include_memory else None
        disk = staging / DISK if config.disk is not None else None
        if include_memory and state == STOPPED:
            raise SnapshotError(f"instance {instance_id} is stopped: a memory snapshot needs it running or paused")
        if state == STOPPED:
            if disk is not None:
                await self._convert(config.disk, config.disk_format, disk)
            return Captured(disk, None, config.vcpus, config.memory_mib)
        async with await self._connect(instance_id) as q:
            status = await q.execute("query-status")
            running = isinstance(status, dict) and status.get("status") == "running"
            if running:
                await q.execute("stop")
            try:
                if memory is not None:
                    fd = await self.runtime.offload(os.open, memory, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                    try:  # qemu writes to a file the agent opened: its own user never may open it
                        await q.execute("getfd", {"fdname": STATE_FD}, fd=fd)
                        await q.execute("migrate", {"uri": f"fd:{STATE_FD}"})
                        await self._migrated(q, "query-migrate")
                    finally:
                        os.close(fd)
                if disk is not None:
                    await self._convert(config.disk, config.disk_format, disk)
            finally:
                if running:
                    await q.execute("cont")
        return Captured(disk, memory, config.vcpus, config.memory_mib)

    async def _migrated(self, q: QmpClient, query: str) -> None:
        """Follow a migration until it completes (SnapshotError when it fails or takes over `migrate_s`)."""
        try:
            async with asyncio.timeout(self.migrate_s):
                while True:
                    info: Any = await q.execute(query)
                    status = info.get("status", "") if isinstance(info, dict) else ""
                    if status == "completed":
                        return
                    if status in ("failed", "cancelled"):
                        why = info.get("error-desc", status) if isinstance(info, dict) else status
                        raise SnapshotError(f"qemu's migration of the VM state {status}: {why}")
                    await asyncio.sleep(MIGRATE_POLL_S)  # QMP has no wait: its MIGRATION event needs a capability
        except TimeoutError:
            raise SnapshotError(f"the VM state did not move within {self.migrate_s:g} s") from None
        except QmpError as e:
            raise SnapshotError(str(e)) from None

    async def _convert(self, src: Path | None, fmt: str, dest: Path) -> None:
        assert src is not None
        try:
            await run_tool([self.qemu_img, "convert", "-U", "-f", fmt, "-O", "qcow2", str(src), str(dest)])
        except ToolFailed as e:
            if e.returncode is None:
                raise SnapshotError(e.line) from None
            raise SnapshotError(f"qemu-img convert failed: {e.line}") from None

    # -- a memory restore's first start ------------------------------------------
    def incoming_argv(self, instance_id: str) -> list[str]:
        """Blocking: `-incoming defer -S` when the directory holds a restored memory state."""
        return ["-incoming", "defer", "-S"] if (self.instance_dir(instance_id) / MEMORY).is_file() else []

    async def finish_incoming(self, instance_id: str, *, paused: bool) -> None:
        """Feed the restored state to the qemu just started with `-incoming defer`, then run it (unless paused)."""
        state = self.instance_dir(instance_id) / MEMORY
        async with await self._connect(instance_id) as q:
            fd = await self.runtime.offload(os.open, state, os.O_RDONLY)
            try:  # qemu reads from a file the agent opened: the state is root's, 0600
                await q.execute("getfd", {"fdname": STATE_FD}, fd=fd)
                await q.execute("migrate-incoming", {"uri": f"fd:{STATE_FD}"})
                await self._incoming_done(q)
                if not paused:
                    await q.execute("cont")
            except (QmpError, SnapshotError) as e:
                raise RuntimeFailure(f"the memory restore failed: {e}") from None
            finally:
                os.close(fd)
        await self.runtime.offload(state.unlink, missing_ok=True)
        log.info("event=instance.memory-restored instance=%s paused=%s", instance_id, paused)

    async def _incoming_done(self, q: QmpClient) -> None:
        try:
            async with asyncio.timeout(self.migrate_s):
                while True:
                    status: Any = await q.execute("query-status")
                    s = status.get("status", "") if isinstance(status, dict) else ""
                    if s != "inmigrate":
                        break
                    await asyncio.sleep(MIGRATE_POLL_S)
        except TimeoutError:
            raise SnapshotError(f"the VM state did not arrive within {self.migrate_s:g} s") from None
        info: Any = await q.execute("query-migrate")
        if isinstance(info, dict) and info.get("status") not in (None, "completed"):
            raise SnapshotError(f"qemu's incoming migration ended {info.get('status')}")
        if s not in ("paused", "prelaunch"):
            raise SnapshotError(f"qemu is {s!r} after the incoming migration")

    # -- identity rebind ---------------------------------------------------------
    async def attach_rebind(self, instance_id: str, image: Path) -> None:
        async with await self._connect(instance_id) as q:
            fd = await self.runtime.offload(os.open, image, os.O_RDWR)
            try:  # handed over as an fd set: the VMM's own user never opens the agent's file
                added = await q.execute("add-fd", {"fdset-id": REBIND_FDSET}, fd=fd)
                fdset = added.get("fdset-id", REBIND_FDSET) if isinstance(added, dict) else REBIND_FDSET
                await q.execute(
                    "blockdev-add",
                    {
                        "driver": "raw",
                        "node-name": SERIAL,
                        "file": {"driver": "file", "filename": f"/dev/fdset/{fdset}"},
                    },
                )
                await q.execute(
                    "device_add", {"driver": "virtio-blk-pci", "id": SERIAL, "drive": SERIAL, "serial": SERIAL}
                )
            except QmpError as e:
                raise RuntimeFailure(f"cannot hot-add the rebind disk: {e}") from None
            finally:
                os.close(fd)

    async def forget(self, keep: set[str]) -> None:
        return None  # everything of an instance's is in its directory, which the runtime's delete removes

    async def detach_rebind(self, instance_id: str) -> None:
        async with await self._connect(instance_id) as q:
            steps = (
                ("device_del", {"id": SERIAL}),
                ("blockdev-del", {"node-name": SERIAL}),
                ("remove-fd", {"fdset-id": REBIND_FDSET}),
            )
            for command, args in steps:
                try:
                    await q.execute(command, args)
                except QmpError as e:  # a guest that ignores the unplug keeps the device; its file goes anyway
                    log.warning(
                        "event=instance.rebind-detach instance=%s step=%s error=%r", instance_id, command, str(e)
                    )
