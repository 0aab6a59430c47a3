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
capacity failure. The root disk and volumes (agent.instances.overlay,
agent.instances.volumes) are `-blockdev`/`-device` pairs (qemu_argv); volumes are
attached and detached live over QMP. NICs: each NIC's persistent tap is made
(owned by the VMM's user), put on its bridge and brought up before qemu starts
(`taps`, agent.instances.net.taps), and deleted when the domain stops or is
deleted. GPUs: the converger binds their IOMMU groups to vfio-pci
(agent.instances.passthrough) before `start`; a confined start then hands
each group's `/dev/vfio/<group>` to the VMM's user (0600, agent.instances.vfio
`hand_over`, refused when another running VMM's user owns it), and a stop, a
delete or a failed start gives it back to root. Under `bc helper` (an agent
that is not root) the root steps are `PrivilegedSteps`' (agent.helper.vm_client):
root launches qemu from the record as the VMM's user, ends a VMM that survives
its stop, hands the GPUs back, and makes and deletes the record's taps
(docs/instances.md, "A VMM under bc helper").
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import shutil
import signal
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from agent.instances import confine as confine_
from agent.instances import qemu_argv, vfio
from agent.instances.net.taps import TapError, TapPort
from agent.instances.qmp import QmpClient, QmpError
from agent.instances.runtime import (
    PAUSED,
    RUNNING,
    STOPPED,
    BalloonReading,
    Domain,
    DomainConfig,
    NoBalloon,
    RuntimeFailure,
    VolumeConfig,
    config_record,
    record_config,
)
from agent.offload import Offload
from bc.runtime.files import atomic_write

log = logging.getLogger(__name__)

RECORD = "vm.json"
QMP_SOCKET = "qmp.sock"
CONSOLE = "console.log"
PIDFILE = "qemu.pid"
USER_DATA_FW_CFG = qemu_argv.USER_DATA_FW_CFG
QEMU = "qemu-system-x86_64"
_PAUSED_STATES = frozenset({"paused", "prelaunch", "suspended", "inmigrate", "postmigrate", "save-vm"})
MAX_STDERR = 4096
MIB = 1024 * 1024
BALLOON_PATH = "/machine/peripheral/bc-balloon"
STATS_POLL_S = 2
DETACH_TRIES = 20
DETACH_WAIT_S = 0.5


class PrivilegedSteps(Protocol):
    """What only root may do for a VMM, for an agent that is not root: `bc helper`'s `vm.*` operations
    (agent.helper.vm_client.HelperVmm). A root agent does these itself and has none."""

    async def launch(self, instance_id: str, *, paused: bool, user_data: bool, accel: tuple[str, ...]) -> None:
        """Root checks the record, takes its GPUs' groups, builds qemu's argv and starts it as the VMM's user."""
        ...

    async def stop(self, instance_id: str) -> None:
        """End the instance's VMM if it still runs, give its group nodes back to root."""
        ...

    async def unvfio(self, instance_id: str) -> None:
        """The instance's GPUs back to their host drivers (refused while its VMM runs)."""
        ...

    async def volume(self, instance_id: str, volume_id: str, *, give: bool) -> None:
        """The volume its record lists to its running VMM's group (`give`), or back to the node's."""
        ...

    async def taps(self, instance_id: str) -> None:
        """The taps its record's NICs name, owned by its VMM user, on their (allowed) bridges and up."""
        ...

    async def untaps(self, instance_id: str) -> None:
        """Those taps deleted."""
        ...


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
        confine: bool | None = None,
        anchors: tuple[Path, ...] = (),
        use_systemd: bool | None = None,
        taps: TapPort | None = None,
        vfio_host: vfio.VfioHost | None = None,
        running_uids: Callable[[], frozenset[int]] = confine_.running_vmm_uids,
        steps: PrivilegedSteps | None = None,
    ) -> None:
        self.root = root
        self.steps = steps
        """Under `bc helper`: root launches and stops each VMM as its own user (None: this agent does, as root)."""
        self.vfio = vfio_host if vfio_host is not None else vfio.SysfsVfio()
        """Where a confined VMM's VFIO group nodes are handed over (the fake tree in tests)."""
        self.running_uids = running_uids
        """Blocking: the VMM uids running a process now (who holds a group is decided from this)."""
        self.confine = os.geteuid() == 0 if confine is None else confine
        """Each VMM as its own user (agent.instances.confine); only a root agent can."""
        self.anchors = (root.parent, *anchors)
        """Where search permission for VMMs may be added: the data directory, the user-data directory."""
        self.use_systemd = (self.confine and confine_.systemd_runs()) if use_systemd is None else use_systemd
        self.offload = offload
        self.binary = binary
        self.accel = accel
        self.stop_grace_s = stop_grace_s
        self.qmp_timeout_s = qmp_timeout_s
        self.taps = taps
        self.incoming: Any = None
        """A memory restore's first start (agent.instances.qemu_snapshot.QemuSnapshots sets itself here)."""

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
                placed = record.get("placement")
                hugepage_mib = _int(placed.get("hugepage_mib")) if isinstance(placed, dict) else 0
                vols = record.get("volumes")
                ids = tuple(str(v.get("id")) for v in vols if isinstance(v, dict)) if isinstance(vols, list) else ()
                out.append(
                    Domain(
                        iid,
                        state,
                        True,
                        _int(record.get("vcpus")),
                        _int(record.get("memory_mib")),
                        hugepage_mib,
                        volumes=ids,
                    )
                )
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
        record = config_record(config)
        await self.offload(_private_dir, self.root)
        if self.confine or self.steps is not None:
            record["uid"] = await self._uid_for(config.id)
        await self.offload(atomic_write, d / RECORD, json.dumps(record, sort_keys=True).encode(), 0o600)

    async def _uid_for(self, instance_id: str) -> int:
        """The domain's VMM uid: the one its record holds, else the lowest that no other record holds and no
        process on this host runs as (another node's VMs on the same host, or a VMM left over: `vm.launch`
        refuses a VMM user that runs a process already)."""
        found = await self.offload(self._scan)
        mine = [r.get("uid") for iid, r in found if iid == instance_id and r is not None]
        if mine and confine_.is_vmm_uid(mine[0]):
            return int(str(mine[0]))
        taken = {int(str(u)) for u in (r.get("uid") for _, r in found if r is not None) if confine_.is_vmm_uid(u)}
        taken |= await self.offload(self.running_uids)
        try:
            return confine_.pick_uid(taken)
        except ValueError as e:
            raise RuntimeFailure(str(e)) from None

    def _grant(self, config: DomainConfig, uid: int, user_data: Path | None) -> None:
        """Blocking: what VMM `uid` opens (agent.instances.confine.grant)."""
        d = self._dir(config.id)
        written = [p for p in (config.disk,) if p is not None]
        written += [v.path for v in config.volumes if not v.read_only]
        shared = [p for p in (config.kernel, config.initrd, config.disk_base) if p is not None]
        # a read-only volume is a tenant's data, never world-readable: its group is this VMM's while it starts
        # (a second reader's start re-groups it; the first keeps the file it has open)
        private = [user_data] if user_data is not None else []
        private += [v.path for v in config.volumes if v.read_only]
        anchors = [*self.anchors, *([user_data.parent] if user_data is not None else [])]
        confine_.grant(uid, d, anchors, written, private, shared)

    async def start(self, instance_id: str, *, paused: bool, user_data: Path | None = None) -> None:
        record = await self._record(instance_id)
        if await self._status(instance_id) != STOPPED:
            raise RuntimeFailure(f"domain {instance_id} is already running")
        if self.steps is not None:
            await self._start_through(self.steps, instance_id, record, paused=paused, user_data=user_data)
            return
        config = record_config(record)
        d = self._dir(instance_id)
        argv = qemu_argv.argv(config, self.binary, self.accel, d, paused=paused, user_data_file=user_data)
        incoming = await self.offload(self.incoming.incoming_argv, instance_id) if self.incoming else []
        argv += [a for a in incoming if a not in argv]
        uid = record.get("uid")
        # Each tap owned by the user qemu runs as: a confined VMM opens it without CAP_NET_ADMIN.
        await self._taps_up(config, uid if self.confine and confine_.is_vmm_uid(uid) else None)
        if self.confine and confine_.is_vmm_uid(uid):
            assert isinstance(uid, int)
            try:
                await self.offload(self._grant, config, uid, user_data)
            except OSError as e:
                raise RuntimeFailure(f"cannot let its VMM user reach its files: {e}") from None
            if config.gpus:  # the groups are on vfio-pci already (agent.instances.passthrough)
                try:
                    groups = await self.offload(
                        vfio.hand_over, self.vfio, list(config.gpus), uid, await self.offload(self.running_uids)
                    )
                except vfio.VfioError as e:
                    raise RuntimeFailure(f"VFIO: {e}") from None
                log.info("event=instance.vfio-handed instance=%s uid=%d groups=%s", instance_id, uid, ",".join(groups))
            if self.use_systemd:  # systemd-run starts it as that user, in its unit
                unit = confine_.domain_unit_argv(config, uid, d, d / PIDFILE)
                argv = unit + argv
            else:
                argv = confine_.drop_to(uid) + argv
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE,
            )
        except OSError as e:
            await self._give_back(instance_id, record)
            raise RuntimeFailure(f"cannot run {self.binary}: {e.strerror}") from None
        _, err = await proc.communicate()
        if proc.returncode != 0:
            await self._give_back(instance_id, record)
            await self._taps_down_after_failed_start(config)
            text = err[-MAX_STDERR:].decode(errors="replace").strip().splitlines()
            last = text[-1] if text else f"exit status {proc.returncode}"
            raise RuntimeFailure(f"qemu did not start: {last}", capacity="Cannot allocate memory" in last)
        if incoming:
            await self._finish_incoming(instance_id, paused)
        log.info(
            "event=instance.qemu-started instance=%s paused=%s accel=%s", instance_id, paused, ",".join(self.accel)
        )

    async def _finish_incoming(self, instance_id: str, paused: bool) -> None:
        """A memory restore's state fed to the qemu just started with `-incoming defer`; a feed that fails ends
        that qemu (a half-restored guest never runs)."""
        assert self.incoming is not None
        try:
            await self.incoming.finish_incoming(instance_id, paused=paused)
        except RuntimeFailure:
            await self._end(instance_id, 0)
            raise

    async def _start_through(
        self,
        steps: PrivilegedSteps,
        instance_id: str,
        record: dict[str, object],
        *,
        paused: bool,
        user_data: Path | None,
    ) -> None:
        """Under `bc helper`: root builds and starts the VMM from the record alone (vm.launch), its user data the
        file of that instance in the node's runtime directory."""
        # A memory restore: root starts qemu with `-incoming defer -S` when it finds the state in the instance's
        # directory, and the state is fed as a root agent feeds it: over QMP, from a file this agent opened.
        incoming = self.incoming is not None and bool(await self.offload(self.incoming.incoming_argv, instance_id))
        config = record_config(record)
        await self._taps_up(config, record.get("uid"))
        try:
            await steps.launch(instance_id, paused=paused, user_data=user_data is not None, accel=self.accel)
        except RuntimeFailure:
            await self._taps_down_after_failed_start(config)
            raise
        if incoming:
            await self._finish_incoming(instance_id, paused)
        log.info("event=instance.qemu-started instance=%s paused=%s through=helper", instance_id, paused)

    async def _qmp(self, instance_id: str, command: str) -> None:
        await self._record(instance_id)
        try:
            async with await QmpClient.connect(self._dir(instance_id) / QMP_SOCKET, self.qmp_timeout_s) as q:
                await q.execute(command)
        except OSError:
            raise RuntimeFailure(f"domain {instance_id} is not running") from None
        except QmpError as e:
            raise RuntimeFailure(str(e)) from None

    async def _balloon_qmp(self, instance_id: str, command: str, arguments: dict[str, object]) -> object:
        await self._record(instance_id)
        try:
            async with await QmpClient.connect(self._dir(instance_id) / QMP_SOCKET, self.qmp_timeout_s) as q:
                return await q.execute(command, arguments or None)
        except OSError:
            raise RuntimeFailure(f"domain {instance_id} is not running") from None
        except QmpError as e:
            if "balloon" in str(e).lower() and command in ("query-balloon", "balloon"):
                raise NoBalloon(f"domain {instance_id} has no balloon device") from None
            raise RuntimeFailure(str(e)) from None

    async def balloon(self, instance_id: str) -> BalloonReading:
        """QMP `query-balloon` for the size; the guest's use from the device's `guest-stats` (total less
        available), whose polling is switched on at the first read (so the second read has it)."""
        got = await self._balloon_qmp(instance_id, "query-balloon", {})
        actual = _int(got.get("actual")) // MIB if isinstance(got, dict) else 0
        used: int | None = None
        try:
            stats = await self._balloon_qmp(instance_id, "qom-get", {"path": BALLOON_PATH, "property": "guest-stats"})
            values = stats.get("stats", {}) if isinstance(stats, dict) else {}
            if isinstance(stats, dict) and _int(stats.get("last-update")) == 0:
                await self._balloon_qmp(
                    instance_id,
                    "qom-set",
                    {"path": BALLOON_PATH, "property": "guest-stats-polling-interval", "value": STATS_POLL_S},
                )
            total, avail = _int(values.get("stat-total-memory")), _int(values.get("stat-available-memory"))
            if total > 0 and avail > 0:
                used = max(0, total - avail) // MIB
        except RuntimeFailure:
            used = None
        return BalloonReading(actual, used)

    async def set_balloon(self, instance_id: str, actual_mib: int) -> None:
        await self._balloon_qmp(instance_id, "balloon", {"value": actual_mib * MIB})

    async def pause(self, instance_id: str) -> None:
        await self._qmp(instance_id, "stop")

    async def resume(self, instance_id: str) -> None:
        await self._qmp(instance_id, "cont")

    async def _end(self, instance_id: str, grace_s: float) -> None:
        """Power button for `grace_s`, then quit, then SIGKILL; returns once the qemu process is gone (its QMP
        socket closes before it has unmapped the guest's memory: huge pages come back only at its exit)."""
        sock = self._dir(instance_id) / QMP_SOCKET
        try:
            q = await QmpClient.connect(sock, self.qmp_timeout_s)
        except (OSError, QmpError):
            return  # nobody listens: already stopped
        pid = await self.offload(self._pid, instance_id)  # now: qemu removes its pid file as it exits
        closed = False
        async with q:
            try:
                if grace_s > 0:
                    await q.execute("system_powerdown")
                    closed = await q.closed(grace_s)
                if not closed:
                    await q.execute("quit")
                    closed = await q.closed(self.qmp_timeout_s)
            except QmpError:
                closed = await q.closed(self.qmp_timeout_s)
        if pid is None or (closed and await exited(pid, self.qmp_timeout_s)):
            return
        if self.steps is not None:  # another user's process: root ends it (vm.stop checks it is this VMM)
            await self.steps.stop(instance_id)
            return
        if await self.offload(self._kill, instance_id, pid) and not await exited(pid, self.qmp_timeout_s):
            raise RuntimeFailure(f"domain {instance_id} survived its stop")

    def _pid(self, instance_id: str) -> int | None:
        """Blocking: the pid in qemu.pid, only while its command line names this instance."""
        try:
            pid = int((self._dir(instance_id) / PIDFILE).read_text().strip())
        except (OSError, ValueError):
            return None
        return pid if self._is_ours(pid, instance_id) else None

    @staticmethod
    def _is_ours(pid: int, instance_id: str) -> bool:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            return False
        return f"bc-{instance_id}".encode() in cmdline

    def _kill(self, instance_id: str, pid: int) -> bool:
        """Blocking: SIGKILL `pid`, only while its command line still names this instance; whether it did."""
        if not self._is_ours(pid, instance_id):
            return False
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return False
        return True

    async def _taps_up(self, config: DomainConfig, owner_uid: object = None) -> None:
        """Each NIC's tap made, bridged and up before qemu opens it (agent.instances.net.taps), owned by
        `owner_uid` (the VMM's user; None: this process's)."""
        if not config.nics:
            return
        if self.steps is not None:  # root makes them from the record, only once their rules are loaded
            await self.steps.taps(config.id)
            return
        if self.taps is None:
            raise RuntimeFailure(f"domain {config.id} has NICs and this runtime makes no taps")
        for nic in config.nics:
            try:
                await self.taps.ensure(nic.tap, nic.bridge, owner_uid if isinstance(owner_uid, int) else None)
            except TapError as e:
                raise RuntimeFailure(str(e)) from None

    async def _taps_down_after_failed_start(self, config: DomainConfig) -> None:
        """The taps of a start that failed taken down; a failure here is logged, never raised: the start's own
        error (qemu's last line, the helper's refusal) is what the instance reports."""
        try:
            await self._taps_down(config)
        except RuntimeFailure as e:
            log.warning("event=instance.taps-left instance=%s error=%r", config.id, str(e))

    async def _taps_down(self, config: DomainConfig) -> None:
        if self.steps is not None and config.nics:
            await self.steps.untaps(config.id)
            return
        if self.taps is None:
            return
        for nic in config.nics:
            try:
                await self.taps.remove(nic.tap)
            except TapError as e:
                raise RuntimeFailure(str(e)) from None

    async def _qmp_call(self, instance_id: str, command: str, arguments: dict[str, object]) -> object:
        try:
            async with await QmpClient.connect(self._dir(instance_id) / QMP_SOCKET, self.qmp_timeout_s) as q:
                return await q.execute(command, arguments)
        except OSError:
            raise RuntimeFailure(f"domain {instance_id} is not running") from None

    async def _rewrite(self, instance_id: str, volumes: tuple[VolumeConfig, ...]) -> None:
        old = await self._record(instance_id)
        # what the config does not hold stays: the VMM's uid (its files' group, and what root checks under the helper)
        record = {**old, **config_record(dataclasses.replace(record_config(old), volumes=volumes))}
        await self.offload(
            atomic_write, self._dir(instance_id) / RECORD, json.dumps(record, sort_keys=True).encode(), 0o600
        )

    async def attach_volume(self, instance_id: str, volume: VolumeConfig) -> None:
        """blockdev-add then device_add (virtio-blk-pci with its serial), then the record."""
        record = await self._record(instance_id)
        config = record_config(record)
        uid = record.get("uid")
        others = tuple(v for v in config.volumes if v.id != volume.id)
        if self.steps is not None:  # root grants what the record lists: the record first
            await self._rewrite(instance_id, (*others, volume))
            try:
                await self.steps.volume(instance_id, volume.id, give=True)
            except RuntimeFailure:
                await self._rewrite(instance_id, config.volumes)
                raise
        elif self.confine and confine_.is_vmm_uid(uid):  # the VMM opens it as its own user
            assert isinstance(uid, int)
            written, private = ([], [volume.path]) if volume.read_only else ([volume.path], [])
            try:
                await self.offload(
                    confine_.grant, uid, self._dir(instance_id), list(self.anchors), written, private, []
                )
            except OSError as e:
                raise RuntimeFailure(f"cannot let its VMM user reach volume {volume.id}: {e}") from None
        try:
            await self._qmp_call(instance_id, "blockdev-add", qemu_argv.volume_blockdev(volume))
            try:
                await self._qmp_call(instance_id, "device_add", qemu_argv.volume_device(volume))
            except QmpError:
                await self._qmp_call(instance_id, "blockdev-del", {"node-name": qemu_argv.volume_node(volume.id)})
                raise
        except (QmpError, RuntimeFailure) as e:
            if self.steps is not None:  # taken back while the record still lists it, then dropped from it
                try:
                    await self.steps.volume(instance_id, volume.id, give=False)
                except RuntimeFailure as back:  # the attach's own failure is what the pass reports
                    log.warning("event=instance.volume-left instance=%s volume=%s error=%r", instance_id, volume.id,
                                str(back))  # fmt: skip
                await self._rewrite(instance_id, config.volumes)
            if isinstance(e, RuntimeFailure):
                raise
            raise RuntimeFailure(f"attach of volume {volume.id} refused: {e}") from None
        await self._rewrite(instance_id, (*others, volume))
        log.info("event=instance.volume-attached instance=%s volume=%s", instance_id, volume.id)

    async def resize_volume(self, instance_id: str, volume_id: str, size_bytes: int) -> None:
        """QMP block_resize of the volume's node: the guest sees its new capacity at once."""
        await self._record(instance_id)
        try:
            await self._qmp_call(
                instance_id, "block_resize", {"node-name": qemu_argv.volume_node(volume_id), "size": size_bytes}
            )
        except QmpError as e:
            raise RuntimeFailure(f"resize of volume {volume_id} refused: {e}") from None
        log.info("event=instance.volume-resized instance=%s volume=%s size=%d", instance_id, volume_id, size_bytes)

    async def detach_volume(self, instance_id: str, volume_id: str) -> None:
        """device_del (the guest lets go: ACPI unplug), then blockdev-del once the device is gone, then the
        record. A guest that does not let go keeps the volume open: RuntimeFailure, tried again next pass."""
        config = record_config(await self._record(instance_id))
        node = qemu_argv.volume_node(volume_id)
        try:
            await self._qmp_call(instance_id, "device_del", {"id": "d" + node})
        except QmpError as e:
            gone_or_going = "not found" in str(e).lower() or "in the process of unplug" in str(e)
            if not gone_or_going:  # already gone (an earlier pass) is fine, and so is an unplug under way
                raise RuntimeFailure(f"detach of volume {volume_id} refused: {e}") from None
        for _ in range(DETACH_TRIES):
            try:
                await self._qmp_call(instance_id, "blockdev-del", {"node-name": node})
                break
            except QmpError as e:
                if "not found" in str(e).lower() or "find node" in str(e).lower():
                    break
                await asyncio.sleep(DETACH_WAIT_S)  # the guest is still letting go of the device
        else:
            raise RuntimeFailure(f"the guest has not let go of volume {volume_id}; it stays attached")
        if self.steps is not None and any(v.id == volume_id for v in config.volumes):  # root reads the record
            await self.steps.volume(instance_id, volume_id, give=False)
        await self._rewrite(instance_id, tuple(v for v in config.volumes if v.id != volume_id))
        log.info("event=instance.volume-detached instance=%s volume=%s", instance_id, volume_id)

    async def _give_back(self, instance_id: str, record: dict[str, object]) -> None:
        """The record's GPU groups' nodes back to root, where its VMM user holds them and runs nothing now."""
        config = record_config(record)
        uid = record.get("uid")
        if not config.gpus or not confine_.is_vmm_uid(uid):
            return
        if self.steps is not None:  # the nodes are root's: vm.stop gives them back
            await self.steps.stop(instance_id)
            return
        assert isinstance(uid, int)
        running = await self.offload(self.running_uids)
        groups = await self.offload(vfio.give_back, self.vfio, list(config.gpus), uid, running)
        if groups:
            log.info("event=instance.vfio-given-back instance=%s groups=%s", instance_id, ",".join(groups))

    async def stop(self, instance_id: str) -> None:
        record = await self._record(instance_id)
        await self._end(instance_id, self.stop_grace_s)
        await self._taps_down(record_config(record))
        await self._give_back(instance_id, record)

    async def delete(self, instance_id: str) -> None:
        d = self._dir(instance_id)
        if not await self.offload(d.exists):
            return
        record = await self._record(instance_id)  # never a directory that is not bc's
        await self._end(instance_id, 0)
        await self._taps_down(record_config(record))
        await self._give_back(instance_id, record)
        if self.steps is not None and record_config(record).gpus:  # root reads the record: before it goes
            await self.steps.unvfio(instance_id)
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
    try:
        return await pidfd_ended(fd, within_s)
    finally:
        os.close(fd)


async def pidfd_ended(fd: int, within_s: float) -> bool:
    """Whether the process behind pidfd `fd` ended within `within_s` (the fd turns readable when it does); the
    fd stays the caller's. One wait for a root agent's stop and the helper's `vm.stop`."""
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


def _private_dir(d: Path) -> None:
    """Blocking: the instances directory exists and no one but root may list or change it (VMMs are given
    search permission, never read)."""
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    mode = stat.S_IMODE(d.stat().st_mode)
    if mode & 0o066:
        d.chmod(mode & ~0o066)


def _remove_tree(d: Path) -> None:
    """Blocking: remove an instance's directory. qemu unlinks its pid file and socket as it exits, which may
    be while this runs (its QMP socket closes first), so a file already gone is no error."""

    def gone_is_fine(fn: object, path: str, exc: tuple[type[BaseException], BaseException, object]) -> None:
        if not isinstance(exc[1], FileNotFoundError):
            raise exc[1]

    shutil.rmtree(d, onerror=gone_is_fine)


def _int(value: object) -> int:
    return value if isinstance(value, int) else 0
