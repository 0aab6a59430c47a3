"""Confinement of a VMM: each instance's qemu runs as its own unprivileged user, in its own process group, and
under systemd in its own transient unit with the reference's sandbox (delivery.md, "The cloud-hypervisor unit").

* **Its own user.** A uid from `VMM_UID_BASE` up, one per instance (the lowest
  no record holds and no process runs as), kept in
  the domain's record (so a restart keeps it) and never shared: no VMM can
  signal, ptrace or open another's files. No passwd entry is needed. Its
  group is the same number; its only extra group is `kvm` when the host has
  one (for `/dev/kvm`).
* **What it may open** (`grant`, blocking): the instance directory becomes
  root's with the VMM's group and mode 1770, so qemu can create its socket,
  pid file and console there, while the sticky bit keeps it from renaming or
  replacing root's files (`vm.json`, the disks); per-instance files it writes
  (the root disk, a writable volume) get its group, read-write (0660); files
  only it reads (its user data) get its group, read-only (0640); shared files
  (kernel, initrd, base images) must be world-readable already and are never
  re-grouped, since another VMM reads them too. Every directory from an
  anchor (the data directory, the user-data directory) down to those files
  gets search permission for others (`o+x`, never read): names stay
  unlistable. The data directory's own parents must already be searchable
  (`/var/lib` is).
* **Its unit** (`transient_unit_argv`, pure): on a host where systemd runs,
  qemu starts through `systemd-run` as `bc-vm-<id>.service` in
  `bc-instances.slice`, so it outlives `bc node` and a restart of the node's
  own unit never takes the VMs with it, with the reference's identity,
  device, file, kernel and limit properties adapted to qemu. Where systemd is
  not PID 1 (containers, these tests) qemu daemonizes into its own session as
  before, still as its own user.

The agent itself must be root to start a process as another user; an agent
running unprivileged under `bc helper` has root start each VMM as its own user
(`vm.launch`, agent.helper.vm_effects); one with no helper runs its VMMs as its
own user, and says so once in its log (docs/instances.md).
"""

from __future__ import annotations

import grp
import os
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agent.instances.runtime import DomainConfig

VMM_UID_BASE = 0x7FFD0000
VMM_UID_SPAN = 0x10000
SLICE = "bc-instances.slice"


def pick_uid(taken: Iterable[int]) -> int:
    """The lowest VMM uid no other domain's record holds (ValueError when all 65,536 are)."""
    used = set(taken)
    for uid in range(VMM_UID_BASE, VMM_UID_BASE + VMM_UID_SPAN):
        if uid not in used:
            return uid
    raise ValueError("every VMM uid is taken")


def is_vmm_uid(uid: object) -> bool:
    return isinstance(uid, int) and not isinstance(uid, bool) and VMM_UID_BASE <= uid < VMM_UID_BASE + VMM_UID_SPAN


def unit_name(instance_id: str) -> str:
    """Always a `.service`: an instance id (a-z 0-9 -) can never name another kind of unit."""
    return f"bc-vm-{instance_id}.service"


def kvm_gid() -> int | None:
    try:
        return grp.getgrnam("kvm").gr_gid
    except KeyError:
        return None


def drop_to(uid: int) -> list[str]:
    """A prefix that runs qemu as VMM `uid` (util-linux `setpriv`: real, effective and saved ids, its only
    extra group `kvm`, no new privileges). Not Popen's `user=`: that makes Python fork rather than vfork,
    and a fork of the agent runs gRPC's fork handlers in the child, which crash it."""
    kvm = kvm_gid()
    groups = [f"--groups={kvm}"] if kvm is not None else ["--clear-groups"]
    return ["setpriv", f"--reuid={uid}", f"--regid={uid}", *groups, "--no-new-privs", "--"]


def systemd_runs() -> bool:
    """Whether systemd is PID 1 here (sd_booted's test)."""
    return Path("/run/systemd/system").is_dir()


def domain_unit_argv(
    config: DomainConfig, uid: int, instance_dir: Path, pidfile: Path, also_readable: Iterable[Path] = ()
) -> list[str]:
    """`transient_unit_argv` for a domain: what its VMM reads (kernel, initrd, base image, read-only volumes and
    `also_readable`, e.g. its user data) and writes (its read-write volumes), from its config. One builder for
    the root agent's start and the helper's `vm.launch`."""
    readable = [p for p in (config.kernel, config.initrd, config.disk_base) if p is not None]
    readable += [v.path for v in config.volumes if v.read_only]
    readable += list(also_readable)
    return transient_unit_argv(
        config.id,
        uid,
        config.vcpus,
        config.memory_mib,
        instance_dir,
        pidfile,
        readable,
        gpus=bool(config.gpus),
        hugepages=bool(config.placement.hugepage_mib),
        writable=[v.path for v in config.volumes if not v.read_only],
    )


def transient_unit_argv(
    instance_id: str,
    uid: int,
    vcpus: int,
    memory_mib: int,
    instance_dir: Path,
    pidfile: Path,
    readable: list[Path],
    *,
    gpus: bool = False,
    hugepages: bool = False,
    writable: list[Path] | None = None,
) -> list[str]:
    """`systemd-run` and its properties, to prefix qemu's own argv (which keeps `-daemonize`: the unit is
    Type=forking and follows the pid file)."""
    overhead = -(-memory_mib // 32) + 256
    memory_max = overhead if hugepages else memory_mib + overhead
    props = [
        "Type=forking",
        f"PIDFile={pidfile}",
        f"User={uid}",
        f"Group={uid}",
        "CapabilityBoundingSet=",
        "AmbientCapabilities=",
        "NoNewPrivileges=yes",
        "LimitMEMLOCK=infinity",
        "UMask=0077",
        "DevicePolicy=closed",
        "DeviceAllow=/dev/kvm rw",
        "DeviceAllow=/dev/net/tun rw",
        "ProtectSystem=strict",
        "ProtectHome=yes",
        "PrivateTmp=yes",
        "ProtectProc=invisible",
        "InaccessiblePaths=-/etc/bc -/etc/ssh -/etc/libvirt /etc/shadow /etc/gshadow",
        f"ReadWritePaths={instance_dir}",
        "ProtectKernelTunables=yes",
        "ProtectKernelModules=yes",
        "ProtectKernelLogs=yes",
        "ProtectControlGroups=yes",
        "ProtectClock=yes",
        "ProtectHostname=yes",
        "RestrictSUIDSGID=yes",
        "RestrictRealtime=yes",
        "RestrictNamespaces=yes",
        "LockPersonality=yes",
        "SystemCallFilter=~@debug @mount @reboot @swap @module @raw-io @clock @cpu-emulation @obsolete",
        "RestrictAddressFamilies=AF_UNIX",
        "IPAddressDeny=any",
        f"MemoryMax={memory_max}M",
        f"TasksMax={4 * vcpus + 128}",
        f"CPUQuota={(vcpus + 1) * 100}%",
    ]
    if gpus:
        props += ["DeviceAllow=/dev/vfio/vfio rw", "DeviceAllow=char-vfio rw"]
    props += [f"BindReadOnlyPaths={p}" for p in readable]
    props += [f"ReadWritePaths={p}" for p in writable or ()]  # its read-write volumes, outside its directory
    argv = ["systemd-run", f"--unit={unit_name(instance_id)}", "--collect", f"--slice={SLICE}", "--quiet"]
    for p in props:
        argv += ["-p", p]
    return [*argv, "--"]


def grant(
    uid: int,
    instance_dir: Path,
    anchors: list[Path],
    written: list[Path],
    private: list[Path],
    shared: list[Path],
) -> None:
    """Blocking: let VMM `uid` reach what it opens, and nothing else (see the module's doc). Raises OSError,
    or PermissionError with one sentence for a shared file others cannot read."""
    os.chown(instance_dir, 0, uid)
    os.chmod(instance_dir, 0o1770)
    for p in written:
        os.chown(p, 0, uid)
        os.chmod(p, 0o660)
    for p in private:
        os.chown(p, 0, uid)
        os.chmod(p, 0o640)
    for p in shared:
        if not os.stat(p).st_mode & stat.S_IROTH:
            raise PermissionError(f"{p} is not readable by others, and a confined VMM must read it")
    for p in [instance_dir, *written, *private, *shared]:
        for d in _between(p, anchors):
            if d == instance_dir:  # its group already reaches it: others need nothing there
                continue
            mode = os.stat(d).st_mode
            if not mode & stat.S_IXOTH:
                os.chmod(d, stat.S_IMODE(mode) | stat.S_IXOTH)


def _between(path: Path, anchors: list[Path]) -> list[Path]:
    """The directories from the nearest anchor holding `path` down to its parent (none if no anchor holds it)."""
    for anchor in sorted(anchors, key=lambda a: -len(a.parts)):
        try:
            rel = path.parent.relative_to(anchor)
        except ValueError:
            continue
        out = [anchor]
        for part in rel.parts:
            out.append(out[-1] / part)
        return out
    return []


def _live_process_uids(proc: Path) -> list[tuple[int, frozenset[int]]]:
    """Blocking: each process's pid and its real, effective, saved and filesystem uids; zombies left out (a
    zombie runs nothing and holds no file)."""
    out: list[tuple[int, frozenset[int]]] = []
    try:
        pids = [n for n in os.listdir(proc) if n.isdigit()]
    except OSError:
        return out
    for pid in pids:
        try:
            with open(proc / pid / "status") as f:
                for line in f:
                    if line.startswith("State:") and line.split()[1:2] == ["Z"]:
                        break
                    if line.startswith("Uid:"):
                        out.append((int(pid), frozenset(map(int, line.split()[1:]))))
                        break
        except (OSError, ValueError):
            continue  # it ended meanwhile
    return out


def running_vmm_uids(proc: Path = Path("/proc")) -> frozenset[int]:
    """Blocking: the VMM uids that run a process now (any of its real, effective, saved or filesystem ids; a zombie
    counts for nothing), read from the kernel's process table: who holds a VFIO group is decided from this, never
    from a record."""
    return frozenset(u for _, uids in _live_process_uids(proc) for u in uids if is_vmm_uid(u))


def processes_of(uid: int, proc: Path = Path("/proc")) -> list[int]:
    """Blocking: the pids of the live processes with `uid` among their ids (a VMM user's: what its stop waits for)."""
    return [pid for pid, uids in _live_process_uids(proc) if uid in uids]
