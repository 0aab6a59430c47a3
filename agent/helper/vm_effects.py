"""`vm.vfio` and `vm.unvfio` carried out as root (agent.helper.vm_ops): read the record, check, then act.

Every check runs before the first write, so a refusal changes nothing. The
record is opened without following a symlink at any step (the instances
directory, the instance's directory, `vm.json`), and an instance directory
holding any symlink is refused: the node owns those directories, root never
lets it point root elsewhere. Blocking: the server runs this through its
offload, under its lock.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent.helper.plans import Refused, VmLaunch, VmStop, VmVfio, VmVolume
from agent.helper.vm_rules import Device, Record, RecordRefused, check_record, group_refusal
from agent.instances import qemu_argv, vfio
from agent.instances.confine import domain_unit_argv, drop_to, is_vmm_uid, processes_of, systemd_runs
from agent.instances.qemu import pidfd_ended
from agent.instances.runtime import DomainConfig, RuntimeFailure, record_config
from agent.instances.snapshot_meta import MEMORY
from agent.instances.vfio_rules import ROOT, take_refusal
from agent.offload import Offload

log = logging.getLogger(__name__)

RECORD = "vm.json"
MAX_RECORD = 1 << 20
_NOFOLLOW = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC


class VmFailed(OSError):
    """A checked operation that failed as root (a device did not move)."""


def read_record(instances: Path, instance_id: str) -> object:
    """The parsed `vm.json` of the instance (Refused: no record, a symlink on the way or in its directory)."""
    try:
        top = os.open(instances, _NOFOLLOW | os.O_DIRECTORY)
    except OSError as e:
        raise Refused(f"cannot open the instances directory {instances}: {e.strerror}") from None
    try:
        try:
            d = os.open(instance_id, _NOFOLLOW | os.O_DIRECTORY, dir_fd=top)
        except FileNotFoundError:
            raise Refused(f"instance {instance_id} has no directory") from None
        except OSError:
            raise Refused(f"instance {instance_id}'s directory is a symlink or not a directory") from None
        try:
            for name in os.listdir(d):
                if stat.S_ISLNK(os.stat(name, dir_fd=d, follow_symlinks=False).st_mode):
                    raise Refused(f"instance {instance_id}'s directory holds a symlink, {name[:80]!r}")
            try:
                f = os.open(RECORD, _NOFOLLOW, dir_fd=d)
            except FileNotFoundError:
                raise Refused(f"instance {instance_id} has no record") from None
            try:
                st = os.fstat(f)
                if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_RECORD:
                    raise Refused(f"instance {instance_id}'s record is not a regular file of at most 1 MiB")
                data = os.read(f, MAX_RECORD + 1)
            finally:
                os.close(f)
        finally:
            os.close(d)
    finally:
        os.close(top)
    try:
        return json.loads(data)
    except ValueError:
        raise Refused(f"instance {instance_id}'s record is not JSON") from None


def checked_record(instances: Path, instance_id: str) -> Record:
    """The record root accepts (agent.helper.vm_rules), each file it names a regular file (Refused if not)."""
    return checked(instances, instance_id)[0]


def checked(instances: Path, instance_id: str) -> tuple[Record, dict[str, object]]:
    """checked_record, and the record itself (what root builds qemu's argv from)."""
    doc = read_record(instances, instance_id)
    try:
        rec = check_record(doc, instance_id, instances.parent)
    except RecordRefused as e:
        raise Refused(str(e)) from None
    assert isinstance(doc, dict)
    for p in rec.files:
        try:
            mode = os.lstat(p).st_mode
        except OSError as e:
            raise Refused(f"instance {instance_id}'s file {p} cannot be read: {e.strerror}") from None
        if not stat.S_ISREG(mode):
            raise Refused(f"instance {instance_id}'s file {p} is not a regular file")
    return rec, doc


def _groups(host: vfio.VfioHost, rec: Record) -> dict[str, list[str]]:
    """Each GPU's group (checked: this host's GPU, only GPUs, their functions and bridges in it), by number."""
    out: dict[str, list[str]] = {}
    for g in rec.gpus:
        try:
            members = [Device(a, host.pci_class(a), host.vendor(a)) for a in host.group(g)]
            n = host.group_id(g)
        except vfio.VfioError as e:
            raise Refused(str(e)) from None
        why = group_refusal(g, members)
        if why is not None:
            raise Refused(why)
        out.setdefault(n, []).append(g)
    return out


def carry(effect: VmVfio, host: vfio.VfioHost, running: Callable[[], frozenset[int]]) -> dict[str, Any]:
    rec = checked_record(effect.instances, effect.instance_id)
    groups = _groups(host, rec)
    now = running()
    if effect.give:
        return _give(host, rec, groups, now)
    return _take_back(host, rec, groups, now)


def _give(host: vfio.VfioHost, rec: Record, groups: dict[str, list[str]], now: frozenset[int]) -> dict[str, Any]:
    for n in sorted(groups, key=int):
        owner = host.node_owner(n)
        # on a host the node appears only once a device of the group is on vfio-pci: none yet is no refusal
        why = take_refusal(n, owner, rec.uid, now) if owner is not None else None
        if why is not None:
            raise Refused(why)
    try:
        moved = [m for g in rec.gpus for m in vfio.bind_group(host, g)]
        handed = vfio.hand_over(host, list(rec.gpus), rec.uid, now)
    except vfio.VfioError as e:
        vfio.release(host, [vfio.Moved(a, "") for g in rec.gpus for a in vfio.endpoints(host, g)])
        raise VmFailed(f"instance {rec.instance_id}'s GPUs: {e}") from None
    log.info("event=helper.vm-vfio instance=%s uid=%d groups=%s", rec.instance_id, rec.uid, ",".join(handed))
    return {"uid": rec.uid, "groups": handed, "moved": [m.address for m in moved]}


def _take_back(host: vfio.VfioHost, rec: Record, groups: dict[str, list[str]], now: frozenset[int]) -> dict[str, Any]:
    owners = {n: host.node_owner(n) for n in groups}
    for n, owner in sorted(owners.items()):
        if owner is None or owner == ROOT:
            continue
        if not is_vmm_uid(owner):
            raise Refused(f"VFIO group {n}'s node is owned by uid {owner}, neither root nor a VMM user")
        if owner in now:
            raise Refused(f"VFIO group {n} is held by the running VMM user {owner}")
    try:
        for n, owner in owners.items():
            if owner not in (None, ROOT):
                host.hand_node(n, ROOT)
        endpoints = [a for g in rec.gpus for a in vfio.endpoints(host, g)]
    except vfio.VfioError as e:
        raise VmFailed(f"instance {rec.instance_id}'s GPUs: {e}") from None
    stuck = vfio.release(host, [vfio.Moved(a, "") for a in endpoints])
    log.info("event=helper.vm-unvfio instance=%s groups=%s", rec.instance_id, ",".join(sorted(groups)))
    return {"groups": sorted(groups, key=int), "stuck": stuck}


# -- vm.launch / vm.stop ---------------------------------------------------------------------------------------

QEMU = "qemu-system-x86_64"
PIDFILE = "qemu.pid"
VMM_FILES = {"qmp.sock": 0o660, "console.log": 0o640, PIDFILE: 0o640}
"""What qemu makes in the instance's directory (its umask under -daemonize is 027) and the node must reach."""
STOP_WAIT_S = 10.0
INCOMING = ("-incoming", "defer", "-S")
"""A memory restore's first start (agent.instances.qemu_snapshot): qemu waits, CPUs stopped, for the state the
node feeds it over QMP (`getfd` of a file the node opened, `migrate-incoming fd:`); root never opens the state."""


_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _walk(top: Path, path: Path, *, search: bool = False, skip: Path | None = None) -> int:
    """A descriptor of the directory `path` under `top`, opened one component at a time from `top` without
    following a symlink (the node owns the directories below `top` and could swap one for a link at any time);
    with `search`, others get search (`o+x`, never read) on each, through its descriptor, but on `skip`."""
    try:
        rel = path.relative_to(top)
    except ValueError:
        raise Refused(f"{path} is not under {top}") from None
    fd = os.open(top, _DIR)
    here = top
    try:
        for part in ("", *rel.parts):
            if part:
                nxt = os.open(part, _DIR, dir_fd=fd)
                os.close(fd)
                fd, here = nxt, here / part
            mode = os.fstat(fd).st_mode
            if search and here != skip and not mode & stat.S_IXOTH:
                os.fchmod(fd, stat.S_IMODE(mode) | stat.S_IXOTH)
    except OSError as e:
        os.close(fd)
        raise Refused(f"{here / part} cannot be reached without following a symlink: {e.strerror}") from None
    return fd


def _open_file(top: Path, path: Path) -> int:
    """A regular file under `top`, opened without following a symlink anywhere below `top`."""
    d = _walk(top, path.parent)
    try:
        fd = os.open(path.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=d)
    except OSError as e:
        raise Refused(f"{path} cannot be opened: {e.strerror}") from None
    finally:
        os.close(d)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise Refused(f"{path} is not a regular file")
    return fd


def _regroup(top: Path, path: Path, uid: int, mode: int) -> None:
    """Give VMM `uid`'s group `mode` on the node's file (its owner stays the node), through the opened file."""
    fd = _open_file(top, path)
    try:
        os.fchown(fd, -1, uid)
        os.fchmod(fd, mode)
    finally:
        os.close(fd)


def grant(rec: Record, config: DomainConfig, d: Path, node_data: Path, user_data: Path | None) -> None:
    """Blocking: what the VMM user opens. The node keeps owning every file; the VMM's group gets what it needs.
    Every directory on the way from the node's data dir gets search (never read) for others, but the instance's
    own, which the VMM reaches as its group."""
    fd = _walk(node_data, d, search=True, skip=d)
    try:
        os.fchown(fd, -1, rec.uid)
        os.fchmod(fd, 0o3770)  # setgid: what qemu makes is the group's; sticky: it cannot remove the node's files
    finally:
        os.close(fd)
    written = [p for p in (config.disk,) if p is not None] + [v.path for v in config.volumes if not v.read_only]
    read_only = [v.path for v in config.volumes if v.read_only]
    shared = [p for p in (config.kernel, config.initrd, config.disk_base) if p is not None]
    for p in [*written, *read_only, *shared]:
        os.close(_walk(node_data, p.parent, search=True, skip=d))
    for p in written:
        _regroup(node_data, p, rec.uid, 0o660)
    for p in read_only:
        _regroup(node_data, p, rec.uid, 0o640)
    for p in shared:
        fd = _open_file(node_data, p)
        try:
            if not os.fstat(fd).st_mode & stat.S_IROTH:
                raise Refused(f"{p} is not readable by others, and a confined VMM must read it")
        finally:
            os.close(fd)
    if user_data is not None:  # <root>/run/bc/user-data/<id>: from root's /run down
        top = user_data.parents[2]
        os.close(_walk(top, user_data.parent, search=True))
        _regroup(top, user_data, rec.uid, 0o640)


def _open_to_node(d: Path, instances: Path) -> None:
    """Blocking: the node's group (that of its instances directory) on what qemu made, each still qemu's (so it
    removes them at its exit: the directory is sticky). Never through a symlink: an O_PATH descriptor's inode."""
    top = _walk(instances.parent, instances)
    try:
        node_gid = os.fstat(top).st_gid
    finally:
        os.close(top)
    dfd = _walk(instances.parent, d)
    try:
        vmm = os.fstat(dfd).st_gid  # the VMM's group, which grant gave the directory
        for name, mode in VMM_FILES.items():
            try:
                fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
            except FileNotFoundError:
                continue
            try:
                st = os.fstat(fd)
                if st.st_uid != vmm or stat.S_ISLNK(st.st_mode):
                    continue  # not the VMM's: leave it as it is
                os.chown(f"/proc/self/fd/{fd}", -1, node_gid)
                os.chmod(f"/proc/self/fd/{fd}", mode)
            finally:
                os.close(fd)
    finally:
        os.close(dfd)


def _is_vmm(pid: int, instance_id: str, uid: int) -> bool:
    """Whether `pid` is VMM `uid`'s qemu of that instance (its real uid, and `-name bc-<id>` on its command line)."""
    try:
        st = os.stat(f"/proc/{pid}")
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return st.st_uid == uid and f"bc-{instance_id}".encode() in cmdline and b"-name" in cmdline


def _pid(d: Path) -> int | None:
    try:
        fd = os.open(d / PIDFILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return int(os.read(fd, 32).decode().strip())
    except ValueError:
        return None
    finally:
        os.close(fd)


def _restoring(d: Path) -> bool:
    """Whether the instance's directory holds a restored memory state (a regular file, never a link's target)."""
    try:
        return stat.S_ISREG(os.lstat(d / MEMORY).st_mode)
    except FileNotFoundError:
        return False


def _prepare(effect: VmLaunch, host: vfio.VfioHost, running: Callable[[], frozenset[int]]) -> list[str]:
    """Blocking: every check, the groups and the grants; qemu's argv as root builds it (`-incoming defer -S`
    when the instance's directory holds a restored memory state, as a root agent's start)."""
    rec, doc = checked(effect.instances, effect.instance_id)
    if effect.user_data is not None:
        os.close(_open_file(effect.user_data.parents[2], effect.user_data))
    now = running()
    if rec.uid in now:
        raise Refused(f"VMM user {rec.uid} of instance {rec.instance_id} runs a process already")
    try:
        config = record_config(doc)
        d = effect.instances / rec.instance_id
        argv = qemu_argv.argv(config, QEMU, effect.accel, d, paused=effect.paused, user_data_file=effect.user_data)
    except RuntimeFailure as e:
        raise Refused(str(e)) from None
    if _restoring(d):
        argv += [a for a in INCOMING if a not in argv]
    groups = _groups(host, rec)  # every GPU checked before anything changes
    for n in sorted(groups, key=int):
        owner = host.node_owner(n)
        why = take_refusal(n, owner, rec.uid, now) if owner is not None else None
        if why is not None:
            raise Refused(why)
    grant(rec, config, d, effect.instances.parent, effect.user_data)
    if rec.gpus:
        _give(host, rec, groups, now)
    if not systemd_runs():  # containers, the tests: qemu daemonizes into its own session as that user
        return drop_to(rec.uid) + argv
    # A child of the helper would live in the helper's unit, and a restart of bc-helper.service would take every
    # VM with it: under systemd each VMM is its own transient unit, as a root agent starts it (confine.py).
    unit = domain_unit_argv(config, rec.uid, d, d / PIDFILE, [effect.user_data] if effect.user_data is not None else [])
    return unit + argv


async def launch(
    effect: VmLaunch, host: vfio.VfioHost, running: Callable[[], frozenset[int]], offload: Offload
) -> dict[str, Any]:
    argv = await offload(_prepare, effect, host, running)
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await proc.communicate()
    if proc.returncode != 0:
        lines = err[-4096:].decode(errors="replace").strip().splitlines()
        rec = await offload(checked_record, effect.instances, effect.instance_id)
        if rec.gpus:  # its user runs nothing: the nodes go back (the devices stay on vfio-pci until vm.unvfio)
            await offload(vfio.give_back, host, list(rec.gpus), rec.uid, await offload(running))
        raise VmFailed(f"qemu did not start: {lines[-1] if lines else f'exit status {proc.returncode}'}")
    d = effect.instances / effect.instance_id
    await offload(_open_to_node, d, effect.instances)
    pid = await offload(_pid, d)
    incoming = await offload(_restoring, d)
    log.info("event=helper.vm-launched instance=%s pid=%s incoming=%s", effect.instance_id, pid, incoming)
    return {"pid": pid, "incoming": incoming}


async def stop(
    effect: VmStop, host: vfio.VfioHost, running: Callable[[], frozenset[int]], offload: Offload
) -> dict[str, Any]:
    rec = await offload(checked_record, effect.instances, effect.instance_id)
    d = effect.instances / effect.instance_id
    pid = await offload(_pid, d)
    killed = False
    if pid is not None and await offload(_is_vmm, pid, rec.instance_id, rec.uid):
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            fd = -1
        if fd >= 0:
            try:
                if await offload(_is_vmm, pid, rec.instance_id, rec.uid):  # the pidfd pins this very process
                    signal.pidfd_send_signal(fd, signal.SIGKILL)
                    killed = True
                    await _ended(fd, STOP_WAIT_S)
            finally:
                os.close(fd)
    await _user_ended(rec.uid, offload)
    groups = await offload(vfio.give_back, host, list(rec.gpus), rec.uid, await offload(running)) if rec.gpus else []
    log.info("event=helper.vm-stopped instance=%s killed=%s groups=%s", rec.instance_id, killed, ",".join(groups))
    return {"killed": killed, "groups": groups}


async def _user_ended(uid: int, offload: Offload) -> None:
    """Wait until the VMM's user runs nothing (at most `STOP_WAIT_S`): a qemu that quit at the node's word (QMP)
    may still be exiting when `vm.stop` comes, and the next `vm.launch` of the instance, like the groups given
    back below, needs its user to run no process (seen: a restore's start refused right after its stop)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + STOP_WAIT_S
    for pid in await offload(processes_of, uid):
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            continue
        try:
            if not await pidfd_ended(fd, max(0.0, deadline - loop.time())):
                raise VmFailed(f"VMM user {uid} still runs process {pid} {STOP_WAIT_S:.0f} s after the stop")
        finally:
            os.close(fd)


async def _ended(fd: int, within_s: float) -> None:
    if not await pidfd_ended(fd, within_s):
        raise VmFailed("the VMM survived SIGKILL")


# -- vm.grant-volume / vm.revoke-volume ---------------------------------------------------------------------


def carry_volume(effect: VmVolume, running: Callable[[], frozenset[int]]) -> dict[str, Any]:
    """Blocking: a live attach's (or detach's) one volume, as the record lists it, to the VMM's group or back."""
    rec, doc = checked(effect.instances, effect.instance_id)
    try:
        config = record_config(doc)
    except RuntimeFailure as e:
        raise Refused(str(e)) from None
    vol = next((v for v in config.volumes if v.id == effect.volume_id), None)
    if vol is None:
        raise Refused(f"instance {rec.instance_id}'s record lists no volume {effect.volume_id}")
    node_data, d = effect.instances.parent, effect.instances / rec.instance_id
    if effect.give:
        if rec.uid not in running():
            raise Refused(
                f"instance {rec.instance_id}'s VMM user {rec.uid} runs no process: vm.launch grants its volumes"
            )
        os.close(_walk(node_data, vol.path.parent, search=True, skip=d))
        mode = 0o640 if vol.read_only else 0o660
        _regroup(node_data, vol.path, rec.uid, mode)
        gid = rec.uid
    else:
        top = _walk(node_data, effect.instances)
        try:
            gid = os.fstat(top).st_gid  # the node's group
        finally:
            os.close(top)
        mode = 0o600
        _regroup(node_data, vol.path, gid, mode)
    log.info("event=helper.vm-volume instance=%s volume=%s gid=%d mode=%o", rec.instance_id, vol.id, gid, mode)
    return {"gid": gid, "mode": f"{mode:04o}"}
