"""The qemu runtime: one `qemu-system-x86_64` per instance, driven over QMP on its unix socket.

Files, under `<data-dir>/instances/<id>/` (0700): `vm.json`, bc's record of
the domain (written by `define`; a directory without one is not bc's, is
listed as unmanaged and never touched), `qmp.sock`, `console.log` (the
serial console) and `qemu.pid`.

* **start** runs qemu with `-daemonize`: it forks, the child calls `setsid`
  (its own session and process group, so it outlives `bc node` and a signal to
  the agent's group never reaches it), and the parent exits once the VM is set
  up, with qemu's error on stderr when it is not. A paused start adds `-S`
  (the CPUs wait in `prelaunch`). The guest boots the record's kernel and
  initrd directly; accelerators are tried in order (`-accel kvm -accel tcg`
  by default; KVM where `/dev/kvm` works, TCG otherwise).
* **state** is QMP's `query-status`: `running` is RUNNING, `paused`,
  `prelaunch` and `suspended` are PAUSED; no one listening on the socket is
  STOPPED (after a host reboot every domain is).
* **pause** / **resume** are QMP `stop` / `cont`.
* **stop** is the ACPI power button (`system_powerdown`) for `stop_grace_s`,
  then `quit`, then SIGKILL to the pid in `qemu.pid` if its command line is
  still this instance's; each wait is for the QMP socket to close, an event.
* **delete** is `quit` (then the same kill) and the directory's removal.

A start that qemu fails for lack of memory ("Cannot allocate memory") is a
capacity failure. Not built: a transient systemd unit per VM, running qemu as
its own unprivileged user with the reference's sandbox, NICs, disks, VFIO
and the balloon (docs/instances.md).
"""

from __future__ import annotations

import asyncio
import builtins
import json
import logging
import os
import shutil
import signal
from pathlib import Path

from agent.instances.qmp import QmpClient, QmpError
from agent.instances.runtime import PAUSED, RUNNING, STOPPED, Domain, DomainConfig, RuntimeFailure
from agent.offload import Offload
from bc.runtime.files import atomic_write

log = logging.getLogger(__name__)

RECORD = "vm.json"
QMP_SOCKET = "qmp.sock"
CONSOLE = "console.log"
PIDFILE = "qemu.pid"
USER_DATA_FW_CFG = "opt/bc/user-data"
QEMU = "qemu-system-x86_64"
_PAUSED_STATES = frozenset({"paused", "prelaunch", "suspended", "inmigrate", "postmigrate", "save-vm"})
MAX_STDERR = 4096


class QemuRuntime:
    name = "qemu"

    def __init__(
        self,
        root: Path,
        offload: Offload,
        *,
        binary: str = QEMU,
        accel: tuple[str, ...] = ("kvm", "tcg"),
        stop_grace_s: float = 60.0,
        qmp_timeout_s: float = 5.0,
    ) -> None:
        self.root = root
        self.offload = offload
        self.binary = binary
        self.accel = accel
        self.stop_grace_s = stop_grace_s
        self.qmp_timeout_s = qmp_timeout_s

    def _dir(self, instance_id: str) -> Path:
        return self.root / instance_id

    # -- reading ------------------------------------------------------------
    def _scan(self) -> list[tuple[str, dict[str, object] | None]]:
        """Blocking: every directory under the root with its record (None: not bc's)."""
        if not self.root.is_dir():
            return []
        out: list[tuple[str, dict[str, object] | None]] = []
        for d in sorted(self.root.iterdir()):
            if not d.is_dir() or d.is_symlink():
                continue
            try:
                record = json.loads((d / RECORD).read_text())
                out.append((d.name, record if isinstance(record, dict) else None))
            except (OSError, ValueError):
                out.append((d.name, None))
        return out

    async def _status(self, instance_id: str) -> str:
        try:
            async with await QmpClient.connect(self._dir(instance_id) / QMP_SOCKET, self.qmp_timeout_s) as q:
                status = await q.execute("query-status")
        except (OSError, QmpError):
            return STOPPED
        s = str(status.get("status", "")) if isinstance(status, dict) else ""
        if s == "running":
            return RUNNING
        if s in _PAUSED_STATES:
            return PAUSED
        return STOPPED

    async def list(self) -> list[Domain]:
        try:
            found = await self.offload(self._scan)
        except OSError as e:
            raise RuntimeFailure(f"cannot list {self.root}: {e.strerror}") from None
        out: list[Domain] = []
        for iid, record in found:
            state = await self._status(iid)
            if record is None:
                out.append(Domain(iid, state, managed=False))
            else:
                out.append(Domain(iid, state, True, _int(record.get("vcpus")), _int(record.get("memory_mib"))))
        return out

    async def _record(self, instance_id: str) -> dict[str, object]:
        try:
            text = await self.offload((self._dir(instance_id) / RECORD).read_text)
            record = json.loads(text)
        except (OSError, ValueError):
            raise RuntimeFailure(f"domain {instance_id} has no record of bc's") from None
        if not isinstance(record, dict):
            raise RuntimeFailure(f"domain {instance_id}'s record is not bc's")
        return record

    # -- changing -----------------------------------------------------------
    async def define(self, config: DomainConfig) -> None:
        d = self._dir(config.id)
        exists = await self.offload(d.exists)
        if exists:
            await self._record(config.id)  # a directory that is not bc's is never defined over
            if await self._status(config.id) != STOPPED:
                raise RuntimeFailure(f"domain {config.id} is not stopped")
        record = {
            "bc": 1,
            "id": config.id,
            "vcpus": config.vcpus,
            "memory_mib": config.memory_mib,
            "kernel": str(config.kernel),
            "initrd": str(config.initrd) if config.initrd is not None else "",
            "cmdline": config.cmdline,
            "allocation_id": config.allocation_id,
        }
        await self.offload(atomic_write, d / RECORD, json.dumps(record, sort_keys=True).encode(), 0o600)

    def _argv(
        self, instance_id: str, record: dict[str, object], paused: bool, user_data: Path | None = None
    ) -> builtins.list[str]:
        d = self._dir(instance_id)
        paths = [str(d / CONSOLE), str(d / QMP_SOCKET), str(d / PIDFILE), str(record["kernel"]), str(record["initrd"])]
        paths += [str(user_data)] if user_data is not None else []
        if any("," in p for p in paths):
            raise RuntimeFailure(f"domain {instance_id}'s paths hold a comma, which qemu's options cannot take")
        argv = [self.binary, "-name", f"bc-{instance_id}", "-nodefaults", "-no-user-config", "-display", "none"]
        for a in self.accel:
            argv += ["-accel", a]
        argv += ["-m", f"{_int(record.get('memory_mib'))}M", "-smp", str(_int(record.get("vcpus")))]
        argv += ["-kernel", str(record["kernel"])]
        if record.get("initrd"):
            argv += ["-initrd", str(record["initrd"])]
        argv += ["-append", str(record.get("cmdline", ""))]
        argv += ["-serial", f"file:{d / CONSOLE}", "-qmp", f"unix:{d / QMP_SOCKET},server=on,wait=off"]
        argv += ["-pidfile", str(d / PIDFILE), "-daemonize"]
        if user_data is not None:  # the guest reads /sys/firmware/qemu_fw_cfg/by_name/opt/bc/user-data/raw
            argv += ["-fw_cfg", f"name={USER_DATA_FW_CFG},file={user_data}"]
        if paused:
            argv.append("-S")
        return argv

    async def start(self, instance_id: str, *, paused: bool, user_data: Path | None = None) -> None:
        record = await self._record(instance_id)
        if await self._status(instance_id) != STOPPED:
            raise RuntimeFailure(f"domain {instance_id} is already running")
        argv = self._argv(instance_id, record, paused, user_data)
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE,
            )
        except OSError as e:
            raise RuntimeFailure(f"cannot run {self.binary}: {e.strerror}") from None
        _, err = await proc.communicate()
        if proc.returncode != 0:
            text = err[-MAX_STDERR:].decode(errors="replace").strip().splitlines()
            last = text[-1] if text else f"exit status {proc.returncode}"
            raise RuntimeFailure(f"qemu did not start: {last}", capacity="Cannot allocate memory" in last)
        log.info(
            "event=instance.qemu-started instance=%s paused=%s accel=%s", instance_id, paused, ",".join(self.accel)
        )

    async def _qmp(self, instance_id: str, command: str) -> None:
        await self._record(instance_id)
        try:
            async with await QmpClient.connect(self._dir(instance_id) / QMP_SOCKET, self.qmp_timeout_s) as q:
                await q.execute(command)
        except OSError:
            raise RuntimeFailure(f"domain {instance_id} is not running") from None
        except QmpError as e:
            raise RuntimeFailure(str(e)) from None

    async def pause(self, instance_id: str) -> None:
        await self._qmp(instance_id, "stop")

    async def resume(self, instance_id: str) -> None:
        await self._qmp(instance_id, "cont")

    async def _end(self, instance_id: str, grace_s: float) -> None:
        """Power button for `grace_s`, then quit, then SIGKILL; returns once qemu is gone."""
        sock = self._dir(instance_id) / QMP_SOCKET
        try:
            q = await QmpClient.connect(sock, self.qmp_timeout_s)
        except (OSError, QmpError):
            return  # nobody listens: already stopped
        async with q:
            try:
                if grace_s > 0:
                    await q.execute("system_powerdown")
                    if await q.closed(grace_s):
                        return
                await q.execute("quit")
                if await q.closed(self.qmp_timeout_s):
                    return
            except QmpError:
                if await q.closed(self.qmp_timeout_s):
                    return
        pid = await self.offload(self._kill, instance_id)
        if pid is not None and not await exited(pid, self.qmp_timeout_s):
            raise RuntimeFailure(f"domain {instance_id} survived its stop")

    def _kill(self, instance_id: str) -> int | None:
        """Blocking: SIGKILL the pid in qemu.pid, only while its command line names this instance; the pid."""
        try:
            pid = int((self._dir(instance_id) / PIDFILE).read_text().strip())
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError):
            return None
        if f"bc-{instance_id}".encode() not in cmdline:
            return None
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return None
        return pid

    async def stop(self, instance_id: str) -> None:
        await self._record(instance_id)
        await self._end(instance_id, self.stop_grace_s)

    async def delete(self, instance_id: str) -> None:
        d = self._dir(instance_id)
        if not await self.offload(d.exists):
            return
        await self._record(instance_id)  # never a directory that is not bc's
        await self._end(instance_id, 0)
        try:
            await self.offload(_remove_tree, d)
        except OSError as e:
            raise RuntimeFailure(f"cannot remove {d}: {e.strerror}") from None


async def exited(pid: int, within_s: float) -> bool:
    """Wait up to `within_s` for process `pid` (not necessarily our child) to end: a pidfd turns readable when
    it does, so this waits on an event. True when it is gone."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    loop = asyncio.get_running_loop()
    done = asyncio.Event()
    loop.add_reader(fd, done.set)
    try:
        async with asyncio.timeout(within_s):
            await done.wait()
        return True
    except TimeoutError:
        return False
    finally:
        loop.remove_reader(fd)
        os.close(fd)


def _remove_tree(d: Path) -> None:
    """Blocking: remove an instance's directory. qemu unlinks its pid file and socket as it exits, which may
    be while this runs (its QMP socket closes first), so a file already gone is no error."""

    def gone_is_fine(fn: object, path: str, exc: tuple[type[BaseException], BaseException, object]) -> None:
        if not isinstance(exc[1], FileNotFoundError):
            raise exc[1]

    shutil.rmtree(d, onerror=gone_is_fine)


def _int(value: object) -> int:
    return value if isinstance(value, int) else 0
