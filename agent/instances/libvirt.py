"""The libvirt runtime: bc's domains on a libvirt connection (`qemu:///system` by default), via libvirt-python.

Enabled on a node when the `libvirt` module imports (the optional extra
`bc[libvirt]`, built against the host's libvirt) and the connection answers
(`open_runtime`). The domain's name is the instance id; its XML is built by
agent.instances.libvirt_xml from the `DomainConfig`, with bc's metadata
marking it as bc's (the only domains this runtime ever changes: any other
domain of the connection is listed unmanaged and never defined over, stopped
or destroyed). Files, under `<data-dir>/libvirt/<id>/` (0700): `console.log`,
the serial console.

* **define** writes (or rewrites, while stopped) the persistent definition.
* **start** defines it again with this start's user-data file as fw_cfg
  `opt/bc/user-data` (or none), then creates it, paused when asked. A start
  libvirt refuses with "Cannot allocate memory" is a capacity failure.
* **state**: running (and blocked, or shutting down) is RUNNING; paused and
  pm-suspended are PAUSED; an inactive domain is STOPPED.
* **pause** / **resume**: `suspend` / `resume`.
* **stop**: `shutdown` (the ACPI power button), and `destroy` once the grace
  (60 s) has passed; returns once the domain is inactive.
* **delete**: `destroy`, `undefine`, and the removal of its directory.
* **volumes, live**: `attachDeviceFlags` / `detachDeviceFlags` (live; a guest
  that has not let go is a failure, tried again next pass) and `blockResize`;
  the persistent definition is rewritten with the volumes, so the next boot
  has them.
* **balloon**: `memoryStats` (`actual`; used = `available` - `usable`, the
  guest's MemTotal less MemAvailable, once its driver has reported) and
  `setMemoryFlags(…, AFFECT_LIVE)`; a domain defined without a balloon
  device is NoBalloon.

libvirt-python's calls block: each runs through the `Offload` seam, on one
connection per runtime, opened again when it has dropped (a call that finds
it dead fails that call; the next opens a new one; a listing retries once).
A stock libvirt runs qemu as its own user and relabels the files a domain
names, but not the directories above them: each define and start first adds
search to those directories under the data directory
(agent.instances.libvirt_access).
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import logging
import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar
from xml.etree import ElementTree as ET

from agent.instances import libvirt_xml
from agent.instances.libvirt_access import domain_files, grant_search, search_dirs
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
)
from agent.offload import Offload

log = logging.getLogger(__name__)

DEFAULT_URI = "qemu:///system"
KIB_PER_MIB = 1024
STOP_POLL_S = 0.25
T = TypeVar("T")


def load() -> Any | None:
    """The libvirt module (libvirt-python), or None when it is not installed."""
    try:
        module = importlib.import_module("libvirt")
    except ImportError:
        return None
    module.registerErrorHandler(lambda _ctx, _err: None, None)  # errors are raised; never printed to stderr
    return module


def domain_type(accel: tuple[str, ...]) -> str:
    """libvirt's domain type for `bc node --instance-accel`: `kvm` when KVM is asked first and /dev/kvm opens,
    else `qemu` (TCG)."""
    if accel and accel[0] == "kvm" and Path("/dev/kvm").exists():
        try:
            with open("/dev/kvm", "rb"):
                return "kvm"
        except OSError:
            pass
    return "qemu"


def open_runtime(
    root: Path, offload: Offload, uri: str, accel: tuple[str, ...], stop_grace_s: float = 60.0
) -> LibvirtRuntime | None:
    """Blocking, at the agent's start: the runtime when the module imports and `uri` answers, else None."""
    module = load()
    if module is None or not uri:
        return None
    rt = LibvirtRuntime(module, uri, root, offload, domain_type=domain_type(accel), stop_grace_s=stop_grace_s)
    try:
        rt.connection()
    except RuntimeFailure as e:
        log.info("event=instance.libvirt-unavailable uri=%s error=%r", uri, str(e))
        return None
    return rt


class LibvirtRuntime:
    name = "libvirt"

    def __init__(
        self,
        module: Any,
        uri: str,
        root: Path,
        offload: Offload,
        *,
        domain_type: str = "kvm",
        stop_grace_s: float = 60.0,
    ) -> None:
        self.lv = module
        self.uri = uri
        self.root = root
        self.offload = offload
        self.domain_type = domain_type
        self.stop_grace_s = stop_grace_s
        self._conn: Any | None = None
        self._lock = threading.Lock()

    def _dir(self, instance_id: str) -> Path:
        return self.root / instance_id

    # -- the connection (blocking: call through offload) -------------------
    def connection(self) -> Any:
        """The open connection, opened again when it has dropped."""
        with self._lock:
            if self._conn is not None:
                try:
                    if self._conn.isAlive():
                        return self._conn
                except self.lv.libvirtError:
                    pass
                self._drop_locked()
            try:
                self._conn = self.lv.open(self.uri)
            except self.lv.libvirtError as e:
                raise RuntimeFailure(f"cannot connect to libvirt at {self.uri}: {_message(e)}") from None
            return self._conn

    def _drop_locked(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except self.lv.libvirtError:
                pass

    def _call(self, fn: Callable[[Any], T], retry: bool = False) -> T:
        """Blocking: `fn(connection)`; a libvirt error becomes RuntimeFailure and drops a dead connection. With
        `retry` (a read, safe to repeat) a call that found the connection dead runs once more on a new one:
        without libvirt's event loop the client learns that the daemon restarted only from a failed call."""
        conn = self.connection()
        try:
            return fn(conn)
        except self.lv.libvirtError as e:
            try:
                alive = conn.isAlive()
            except self.lv.libvirtError:
                alive = False
            if not alive:
                with self._lock:
                    if self._conn is conn:
                        self._drop_locked()
                if retry:
                    return self._call(fn)
            raise RuntimeFailure(_message(e), capacity="Cannot allocate memory" in _message(e)) from None
        except OSError as e:
            raise RuntimeFailure(f"{e.filename or 'a file'}: {e.strerror}") from None

    async def _run(self, fn: Callable[[Any], T], *, retry: bool = False) -> T:
        return await self.offload(self._call, fn, retry)

    def _lookup(self, conn: Any, instance_id: str) -> Any | None:
        try:
            return conn.lookupByName(instance_id)
        except self.lv.libvirtError as e:
            if e.get_error_code() == self.lv.VIR_ERR_NO_DOMAIN:
                return None
            raise

    def _ours(self, conn: Any, instance_id: str) -> tuple[Any, DomainConfig]:
        """Blocking: bc's domain of that name and its config; RuntimeFailure for none, or someone else's. Read
        from the persistent definition, where bc writes (a live volume change rewrites it, not the live XML's
        metadata)."""
        dom = self._lookup(conn, instance_id)
        if dom is None:
            raise RuntimeFailure(f"domain {instance_id} is not defined")
        config = libvirt_xml.read_domain(dom.XMLDesc(self.lv.VIR_DOMAIN_XML_INACTIVE)).config
        if config is None or config.id != instance_id:
            raise RuntimeFailure(f"domain {instance_id} is not bc's; it is left alone")
        return dom, config

    def _state(self, dom: Any) -> str:
        if not dom.isActive():
            return STOPPED
        state = dom.state()[0]
        if state in (self.lv.VIR_DOMAIN_PAUSED, self.lv.VIR_DOMAIN_PMSUSPENDED):
            return PAUSED
        if state in (self.lv.VIR_DOMAIN_SHUTOFF, self.lv.VIR_DOMAIN_CRASHED):
            return STOPPED
        return RUNNING

    # -- reading ------------------------------------------------------------
    def _list(self, conn: Any) -> list[Domain]:
        out: list[Domain] = []
        for dom in conn.listAllDomains(0):
            try:
                read = libvirt_xml.read_domain(dom.XMLDesc(self.lv.VIR_DOMAIN_XML_INACTIVE))
                state = self._state(dom)
            except self.lv.libvirtError as e:
                if e.get_error_code() == self.lv.VIR_ERR_NO_DOMAIN:
                    continue  # undefined while we listed
                raise
            except RuntimeFailure:
                out.append(Domain(dom.name(), STOPPED, managed=False))
                continue
            if read.config is None:
                out.append(Domain(read.name, state, False, read.vcpus, read.memory_mib))
            else:
                c = read.config
                out.append(Domain(c.id, state, True, c.vcpus, c.memory_mib, c.placement.hugepage_mib))
        return sorted(out, key=lambda d: d.id)

    async def list(self) -> list[Domain]:
        return await self._run(self._list, retry=True)

    # -- changing -----------------------------------------------------------
    def _define(self, conn: Any, config: DomainConfig) -> None:
        dom = self._lookup(conn, config.id)
        if dom is not None:
            self._ours(conn, config.id)  # a domain that is not bc's is never defined over
            if dom.isActive():
                raise RuntimeFailure(f"domain {config.id} is not stopped")
        d = self._dir(config.id)
        d.mkdir(mode=0o700, parents=True, exist_ok=True)
        grant_search(search_dirs(self.root.parent, domain_files(config)))
        uuid = dom.UUIDString() if dom is not None else ""
        conn.defineXML(libvirt_xml.domain_xml(config, self.domain_type, d, uuid=uuid))

    async def define(self, config: DomainConfig) -> None:
        await self._run(lambda conn: self._define(conn, config))

    def _start(self, conn: Any, instance_id: str, paused: bool, user_data: Path | None) -> None:
        dom, config = self._ours(conn, instance_id)
        if dom.isActive():
            raise RuntimeFailure(f"domain {instance_id} is already running")
        d = self._dir(instance_id)
        d.mkdir(mode=0o700, parents=True, exist_ok=True)
        grant_search(search_dirs(self.root.parent, domain_files(config), user_data))
        # This start's user data (or none): the persistent definition names the file only until the next start.
        xml = libvirt_xml.domain_xml(config, self.domain_type, d, uuid=dom.UUIDString(), user_data_file=user_data)
        dom = conn.defineXML(xml)
        dom.createWithFlags(self.lv.VIR_DOMAIN_START_PAUSED if paused else 0)

    async def start(self, instance_id: str, *, paused: bool, user_data: Path | None = None) -> None:
        await self._run(lambda conn: self._start(conn, instance_id, paused, user_data))
        log.info("event=instance.libvirt-started instance=%s paused=%s type=%s", instance_id, paused, self.domain_type)

    async def pause(self, instance_id: str) -> None:
        await self._run(lambda conn: self._ours(conn, instance_id)[0].suspend())

    async def resume(self, instance_id: str) -> None:
        await self._run(lambda conn: self._ours(conn, instance_id)[0].resume())

    def _shutdown(self, conn: Any, instance_id: str) -> bool:
        """Blocking: press the power button; whether the domain was running."""
        dom, _ = self._ours(conn, instance_id)
        if not dom.isActive():
            return False
        dom.shutdown()
        return True

    def _destroy(self, conn: Any, instance_id: str) -> None:
        dom, _ = self._ours(conn, instance_id)
        try:
            dom.destroy()
        except self.lv.libvirtError:
            if dom.isActive():
                raise  # else it went while we asked: gone is what a destroy wants

    def _active(self, conn: Any, instance_id: str) -> bool:
        return bool(self._ours(conn, instance_id)[0].isActive())

    async def stop(self, instance_id: str) -> None:
        """The power button for the grace, then destroy. libvirt's lifecycle events need its event loop
        running in a thread of its own; a shutdown is rare enough that asking every quarter second is cheaper."""
        if not await self._run(lambda conn: self._shutdown(conn, instance_id)):
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.stop_grace_s
        while loop.time() < deadline:
            if not await self._run(lambda conn: self._active(conn, instance_id)):
                return
            await asyncio.sleep(STOP_POLL_S)
        await self._run(lambda conn: self._destroy(conn, instance_id))
        log.info("event=instance.libvirt-destroyed instance=%s reason=grace", instance_id)

    def _delete(self, conn: Any, instance_id: str) -> None:
        dom = self._lookup(conn, instance_id)
        if dom is not None:
            self._ours(conn, instance_id)  # never a domain that is not bc's
            if dom.isActive():
                self._destroy(conn, instance_id)
            dom.undefineFlags(self.lv.VIR_DOMAIN_UNDEFINE_MANAGED_SAVE | self.lv.VIR_DOMAIN_UNDEFINE_SNAPSHOTS_METADATA)
        try:
            shutil.rmtree(self._dir(instance_id))
        except FileNotFoundError:
            pass
        except OSError as e:
            raise RuntimeFailure(f"cannot remove {self._dir(instance_id)}: {e.strerror}") from None

    async def delete(self, instance_id: str) -> None:
        await self._run(lambda conn: self._delete(conn, instance_id))

    # -- volumes, live ------------------------------------------------------
    def _redefine(self, conn: Any, dom: Any, config: DomainConfig) -> None:
        """The persistent definition (and bc's record in it) rewritten, so the next boot has what the live
        domain now has."""
        d = self._dir(config.id)
        conn.defineXML(libvirt_xml.domain_xml(config, self.domain_type, d, uuid=dom.UUIDString()))

    def _attach(self, conn: Any, instance_id: str, volume: VolumeConfig) -> None:
        dom, config = self._ours(conn, instance_id)
        if not dom.isActive():
            raise RuntimeFailure(f"domain {instance_id} is not running")
        grant_search(search_dirs(self.root.parent, [volume.path]))
        disk = libvirt_xml.volume_disk(volume, libvirt_xml.free_vd(dom.XMLDesc(0)))
        dom.attachDeviceFlags(ET.tostring(disk, encoding="unicode"), self.lv.VIR_DOMAIN_AFFECT_LIVE)
        kept = tuple(v for v in config.volumes if v.id != volume.id)
        self._redefine(conn, dom, dataclasses.replace(config, volumes=(*kept, volume)))

    async def attach_volume(self, instance_id: str, volume: VolumeConfig) -> None:
        await self._run(lambda conn: self._attach(conn, instance_id, volume))
        log.info("event=instance.volume-attached instance=%s volume=%s runtime=libvirt", instance_id, volume.id)

    def _volume(self, config: DomainConfig, volume_id: str) -> VolumeConfig:
        found = next((v for v in config.volumes if v.id == volume_id), None)
        if found is None:
            raise RuntimeFailure(f"domain {config.id} has no volume {volume_id}")
        return found

    def _detach(self, conn: Any, instance_id: str, volume_id: str) -> None:
        dom, config = self._ours(conn, instance_id)
        volume = self._volume(config, volume_id)
        disk = libvirt_xml.disk_of(dom.XMLDesc(0), volume.path) if dom.isActive() else None
        if disk is not None:
            dom.detachDeviceFlags(disk, self.lv.VIR_DOMAIN_AFFECT_LIVE)  # libvirt waits a few s for the guest
            if libvirt_xml.disk_of(dom.XMLDesc(0), volume.path) is not None:
                raise RuntimeFailure(f"the guest has not let go of volume {volume_id} yet")
        kept = tuple(v for v in config.volumes if v.id != volume_id)
        self._redefine(conn, dom, dataclasses.replace(config, volumes=kept))

    async def detach_volume(self, instance_id: str, volume_id: str) -> None:
        await self._run(lambda conn: self._detach(conn, instance_id, volume_id))
        log.info("event=instance.volume-detached instance=%s volume=%s runtime=libvirt", instance_id, volume_id)

    def _resize(self, conn: Any, instance_id: str, volume_id: str, size_bytes: int) -> None:
        dom, config = self._ours(conn, instance_id)
        volume = self._volume(config, volume_id)
        dom.blockResize(str(volume.path), size_bytes, self.lv.VIR_DOMAIN_BLOCK_RESIZE_BYTES)

    async def resize_volume(self, instance_id: str, volume_id: str, size_bytes: int) -> None:
        await self._run(lambda conn: self._resize(conn, instance_id, volume_id, size_bytes))

    # -- the balloon --------------------------------------------------------
    def _balloon(self, conn: Any, instance_id: str) -> BalloonReading:
        dom, config = self._ours(conn, instance_id)
        if not config.placement.balloon:
            raise NoBalloon(f"domain {instance_id} has no balloon device")
        if not dom.isActive():
            raise RuntimeFailure(f"domain {instance_id} is not running")
        stats = dom.memoryStats()
        actual = int(stats.get("actual", 0)) // KIB_PER_MIB
        total, usable = int(stats.get("available", 0)), int(stats.get("usable", 0))
        used = max(0, total - usable) // KIB_PER_MIB if total > 0 and usable > 0 else None
        return BalloonReading(actual, used)

    async def balloon(self, instance_id: str) -> BalloonReading:
        return await self._run(lambda conn: self._balloon(conn, instance_id))

    def _set_balloon(self, conn: Any, instance_id: str, actual_mib: int) -> None:
        dom, config = self._ours(conn, instance_id)
        if not config.placement.balloon:
            raise NoBalloon(f"domain {instance_id} has no balloon device")
        dom.setMemoryFlags(actual_mib * KIB_PER_MIB, self.lv.VIR_DOMAIN_AFFECT_LIVE)

    async def set_balloon(self, instance_id: str, actual_mib: int) -> None:
        await self._run(lambda conn: self._set_balloon(conn, instance_id, actual_mib))


def _message(e: Exception) -> str:
    """libvirt's message, on one line."""
    text = e.get_error_message() if hasattr(e, "get_error_message") else str(e)
    return " ".join(str(text or e).split())
