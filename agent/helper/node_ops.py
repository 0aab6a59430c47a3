"""The agent's root effects through `bc helper`: the helper-backed side of each seam (agent.converge.host_ops).

An unprivileged `bc node` (`--helper-socket`) uses these in place of the
direct implementations; the code above each seam (the convergers, the kinds)
is the same. Reads stay in the agent: the CDI and env files, the host unit
drop-ins, `/sys`, the cgroup tree and systemd's runtime directory are
world-readable. Every failure is a `HelperError` (an OSError, message
`helper: …`), which the convergers take as a retryable write error: the
section stays PROGRESSING and nothing is released.

* `HelperHoldFiles`: `file.write` / `file.remove` of kind `cdi` or `allocation-env`.
* `HelperSlices`: `slice.apply` / `slice.remove`; presence and population read from the cgroup tree.
* `HelperHostOps`: the host units' writes become `host.file.*` (by key, never by path),
  `host.hugepages` and `host.run`; the GPU node units' packages, runtime configuration and Kubernetes join
  `host.package`, `host.runtime.config` and `host.kubeadm.join` (agent.helper.gpu_ops); their read-only
  queries (`dpkg-query`, `rpm -q`, `systemctl is-active`) run in the agent, unprivileged; the units' records
  are the agent's own state, kept under its data dir.
* `HelperSshdFiles` / `HelperSshdTools`: the access converger's files as `sshd.write` / `sshd.remove`, and
  `sshd.check` / `sshd.reload` (the KRL is still built by `ssh-keygen` in the agent: it needs no root).
* `HelperHardware`: a backend whose `reset_gpu` and `reboot` ask the helper (`gpu.reset`, `node.reboot`).
* `HelperSlots`: the self-update's A/B install dir (agent.upgrade.slots.SlotStore): the download is staged
  in the agent's data dir, then sent to the helper (`update.stage`), which verifies it again before it
  places it (`update.install`); each swap step is `update.step`, the refusal memory `update.remember`.
  Its errors are the seam's own: `SlotsRefused` (the helper said no) and `SlotsUnavailable` (it is down).
* `HelperXids`: the XIDs of the kernel log, which the helper streams (`kmsg.follow`), for NVML's diag; the
  direct read when the helper has no such operation.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import re
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from agent.converge.access import read_managed
from agent.converge.gpu_packages import Package
from agent.converge.host import RECORDS_DIR
from agent.converge.host_ops import COMMAND_TIMEOUT_S, PACKAGE_TIMEOUT_S, CommandFailed, HostOps, RunProcess
from agent.converge.kubeadm import redact
from agent.converge.sshd import SshdTools
from agent.helper.client import HelperClient, HelperError, HelperRefused, HelperUnavailable
from agent.helper.ops import HOST_FILE_KEYS
from agent.helper.update_ops import MAX_CHUNK
from agent.hw.base import ActionDisabled, HardwareBackend, ProcessResult, run_process
from agent.hw.limits import Limits
from agent.hw.nvml import MAX_XIDS_PER_GPU, REBOOT_DISABLED, RESET_DISABLED, XidsByPci, XidSource, pci_key
from agent.hw.slices import SystemdSlices
from agent.offload import Offload, to_thread
from agent.upgrade import swap_rules as sr
from agent.upgrade.slots import SlotsRefused, SlotsUnavailable, partial_file, read_disk
from bc.pki.releases import Release
from bc.protocol.host_units import Join
from bc.runtime.aio import wait_event

log = logging.getLogger(__name__)


class HelperHoldFiles:
    def __init__(self, client: HelperClient, cdi_dir: Path, env_dir: Path) -> None:
        self.client = client
        self.cdi_dir = cdi_dir
        self.env_dir = env_dir

    async def prepare(self) -> None:
        """Nothing: the helper makes the directories on its first write and writes through its own temp files."""

    async def write(self, kind: str, allocation_id: str, data: bytes) -> None:
        await self.client.call("file.write", kind=kind, allocation_id=allocation_id, data=data.decode())

    async def remove(self, kind: str, allocation_id: str) -> bool:
        result = await self.client.call("file.remove", kind=kind, allocation_id=allocation_id)
        return bool(result.get("removed"))


class HelperSlices(SystemdSlices):
    """Reads the cgroup tree and systemd's runtime directory as `SystemdSlices` does; changes through the helper."""

    def __init__(self, client: HelperClient, root: Path, *, offload: Offload = to_thread) -> None:
        super().__init__(
            cgroup_root=root / "sys/fs/cgroup", control_dir=root / "run/systemd/system.control", offload=offload
        )
        self.client = client

    async def apply(self, name: str, limits: Limits) -> None:
        fields = ("cpu_millis", "memory_bytes", "hugepages_1gi", "hugepages_2mi", "cpus", "mems")
        await self.client.call("slice.apply", slice=name, limits={f: getattr(limits, f) for f in fields})

    async def stop(self, name: str) -> None:
        await self.client.call("slice.remove", slice=name)


_HUGEPAGES = re.compile(
    r"sys/(?:kernel/mm|devices/system/node/node(?P<node>\d+))/hugepages/hugepages-(?P<size>\d+)kB/nr_hugepages"
)


class HelperHostOps(HostOps):
    """The host units' effects through the helper; their records (the agent's memory) under `state_root`.
    `query`: where read-only commands run (the agent's own runner: `run_process`, or a fake's)."""

    def __init__(
        self,
        client: HelperClient,
        root: Path,
        state_root: Path,
        *,
        offload: Offload = to_thread,
        query: RunProcess = run_process,
    ) -> None:
        super().__init__(root, run=self._refuse_run, offload=offload)
        self.client = client
        self.state_root = state_root
        self.query_run = query

    def path(self, rel: str) -> Path:
        if rel.startswith(RECORDS_DIR + "/") or rel == RECORDS_DIR:
            return self.state_root.joinpath(*super().path(rel).relative_to(self.root).parts)
        return super().path(rel)

    def _own(self, rel: str) -> bool:
        return self.path(rel).is_relative_to(self.state_root)

    async def write(self, rel: str, data: bytes, mode: int = 0o644) -> None:
        if self._own(rel):
            return await super().write(rel, data, mode)
        await self.client.call("host.file.write", file=_key(rel), data=data.decode())

    async def remove(self, rel: str) -> bool:
        if self._own(rel):
            return await super().remove(rel)
        return bool((await self.client.call("host.file.remove", file=_key(rel))).get("removed"))

    async def write_sysfs(self, rel: str, text: str) -> None:
        m = _HUGEPAGES.fullmatch(rel)
        if m is None:
            raise HelperRefused(f"helper: the helper has no operation that writes {rel}")
        node = int(m["node"]) if m["node"] is not None else None
        await self.client.call("host.hugepages", size_kb=int(m["size"]), node=node, count=int(text))

    async def command(self, *argv: str, timeout_s: float = 0.0) -> ProcessResult:
        # `sysctl -p FILE` loads the helper's own drop-in: the helper names the file.
        args = ["sysctl", "-p"] if argv[:2] == ("sysctl", "-p") else list(argv)
        await self.client.call("host.run", argv=args)
        return ProcessResult(0, b"", b"")

    async def query(self, *argv: str, timeout_s: float = COMMAND_TIMEOUT_S) -> ProcessResult:
        try:
            return await self.query_run(list(argv), timeout_s=timeout_s)
        except (OSError, TimeoutError) as e:
            raise CommandFailed(f"{' '.join(argv)}: {e or type(e).__name__}") from None

    async def package(self, manager: str, action: str, pkg: Package) -> None:
        await self.client.call(
            "host.package",
            timeout_s=PACKAGE_TIMEOUT_S + 60,
            manager=manager,
            action=action,
            unit=pkg.unit,
            branch=pkg.branch,
            version=pkg.version,
        )

    async def runtime_config(self, kind: str, present: bool, cdi_dir: str) -> bool:
        """The helper merges into its own files, pointing at its own CDI directory (`cdi_dir` is that one)."""
        return bool((await self.client.call("host.runtime.config", runtime=kind, present=present)).get("changed"))

    async def kubeadm_join(self, join: Join) -> None:
        try:
            await self.client.call(
                "host.kubeadm.join",
                timeout_s=PACKAGE_TIMEOUT_S,
                api_server=join.api_server,
                token=join.token,
                ca_cert_hashes=list(join.ca_cert_hashes),
                labels=dict(join.labels),
            )
        except HelperError as e:  # the helper redacts too; the agent's own message must never carry the token
            raise type(e)(redact(str(e), join)) from None

    @staticmethod
    async def _refuse_run(argv: Sequence[str], *, timeout_s: float | None = None) -> ProcessResult:
        raise HelperRefused("helper: an unprivileged node runs no host command itself")


def _key(rel: str) -> str:
    key = HOST_FILE_KEYS.get(rel)
    if key is None:
        raise HelperRefused(f"helper: the helper has no file {rel}")
    return key


SSHD_KEYS = {"ca.pub": "ca", "revoked.krl": "krl", "revoked.krl.src": "krl-src", "sshd.conf": "dropin"}


def _sshd_args(rel: str) -> dict[str, Any]:
    if rel.startswith("principals/"):
        return {"file": "principals", "user": rel.removeprefix("principals/")}
    if rel not in SSHD_KEYS:
        raise HelperRefused(f"helper: the helper has no sshd file {rel}")
    return {"file": SSHD_KEYS[rel]}


class HelperSshdFiles:
    """The managed files under the helper's SSH directory, read here (world-readable) and changed there."""

    def __init__(self, client: HelperClient, ssh_dir: Path, *, offload: Offload = to_thread) -> None:
        self.client = client
        self.ssh_dir = ssh_dir
        self.offload = offload

    async def replace(self, files: dict[str, bytes]) -> None:
        for rel, data in files.items():
            text = data.decode("latin-1" if rel == "revoked.krl" else "utf-8")  # the KRL is binary
            await self.client.call("sshd.write", **_sshd_args(rel), data=text)
        for rel in await self.offload(read_managed, self.ssh_dir):
            if rel not in files:
                await self.client.call("sshd.remove", **_sshd_args(rel))


class HelperSshdTools(SshdTools):
    """`sshd -t` and the reload as root, through the helper; the KRL is built here."""

    def __init__(self, client: HelperClient, *, offload: Offload = to_thread) -> None:
        super().__init__(offload=offload)
        self.client = client

    async def check(self) -> str | None:
        try:
            await self.client.call("sshd.check")
        except HelperRefused as e:
            return str(e)
        return None

    async def reload(self) -> None:
        await self.client.call("sshd.reload")
        self.reloads += 1


class HelperHardware:
    """The agent's backend, with its two root actions sent to the helper; everything else it reads itself."""

    def __init__(self, inner: HardwareBackend, client: HelperClient) -> None:
        self.inner = inner
        self.client = client
        self.capabilities = inner.capabilities

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def inventory(self) -> Any:
        return self.inner.inventory()

    def boot_id(self) -> str:
        return self.inner.boot_id()

    def describe(self) -> str:
        return f"{self.inner.describe()} (root actions through bc helper)"

    def diag(self, uuids: Sequence[str]) -> dict[str, dict[str, Any]]:
        return self.inner.diag(uuids)

    async def reset_gpu(self, uuid: str, *, allow: bool = False) -> tuple[bool, str]:
        if not allow:
            return False, RESET_DISABLED
        try:
            await self.client.call("gpu.reset", uuid=uuid)
        except HelperError as e:
            return False, str(e)
        return True, "reset"

    async def reboot(self, *, allow: bool = False) -> tuple[bool, str]:
        if not allow:
            raise ActionDisabled(REBOOT_DISABLED)
        try:
            await self.client.call("node.reboot")
        except HelperError as e:
            return False, str(e)
        log.warning("event=node.rebooting via=helper")
        await asyncio.Event().wait()  # systemd stops the agent as the machine goes down
        raise AssertionError("unreachable")  # pragma: no cover


# -- self-update -----------------------------------------------------------------------------------

KeyChain = Callable[[], list[tuple[bytes, bytes]]]
"""The agent's trusted release keys, each with a root's endorsement of it (empty when it has none)."""


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


@asynccontextmanager
async def _as_slots_errors() -> AsyncIterator[None]:
    try:
        yield
    except HelperUnavailable as e:
        raise SlotsUnavailable(str(e)) from None
    except HelperError as e:
        raise SlotsRefused(str(e)) from None


class HelperSlots:
    """The A/B install dir, root's: read here (world-readable), changed by the helper one step at a time."""

    def __init__(
        self, client: HelperClient, install_dir: Path, stage_dir: Path, keys: KeyChain, *, offload: Offload = to_thread
    ) -> None:
        self.client = client
        self.dir = install_dir
        self.stage_dir = stage_dir
        self.keys = keys
        self.offload = offload

    def partial_path(self, disk: sr.Disk) -> Path:
        """The download lands in the agent's own dir; the helper gets it through update.stage."""
        return self.stage_dir / partial_file(sr.other(disk.current))

    async def read(self) -> sr.Disk:
        return await self.offload(read_disk, self.dir)

    async def _call(self, op: str, **args: Any) -> sr.Disk:
        async with _as_slots_errors():
            reply = await self.client.call(op, **args)
        try:
            return sr.disk_from_json(reply["disk"])
        except (KeyError, TypeError, ValueError) as e:
            raise SlotsRefused(f"helper: {op} answered no disk ({type(e).__name__})") from None

    async def take(self, disk: sr.Disk, step: sr.Step, plan: sr.Plan | None = None) -> sr.Disk:
        if step is sr.Step.RESTART:
            return disk
        if step is sr.Step.STAGE:  # the helper starts its staged file (and says now whether it would take one)
            await self.offload(self.stage_dir.mkdir, 0o700, True, True)
            return await self._call("update.stage", offset=0, data="")
        if step is sr.Step.PLACE:
            raise sr.SwapError("can't place without the release: HelperSlots.place")
        if step is sr.Step.ARM:
            assert plan is not None, "ARM takes the plan's command and deadline"
            return await self._call("update.step", step=step.value, command_id=plan.command_id, deadline=plan.deadline)
        return await self._call("update.step", step=step.value)

    async def remember(self, disk: sr.Disk, refused: sr.Refused | None) -> sr.Disk:
        if refused == disk.record.refused:
            return disk
        return await self._call("update.remember", refused=refused.to_json() if refused is not None else None)

    async def place(self, disk: sr.Disk, plan: sr.Plan, release: Release, signature: bytes) -> sr.Disk:
        """Send the verified download to the helper, which verifies it again and places it; the agent's copy
        is removed either way (a retry downloads again)."""
        staged = self.partial_path(disk)
        try:
            offset = 0
            while True:
                chunk: bytes = await self.offload(_read_at, staged, offset, MAX_CHUNK)
                if not chunk:
                    break
                await self._call("update.stage", offset=offset, data=_b64(chunk))
                offset += len(chunk)
            keys = [{"public_key": _b64(k), "root_signature": _b64(sig)} for k, sig in self.keys()]
            running = disk.record.slots.get(disk.current)
            return await self._call(
                "update.install",
                name=release.name,
                version=release.version,
                sequence=release.sequence,
                platform=release.platform,
                sha256=release.sha256,
                size=release.size,
                signature=_b64(signature),
                keys=keys,
                running_version=running.version if running is not None and running.version else "0",
            )
        finally:
            await self.offload(staged.unlink, True)


def _read_at(path: Path, offset: int, n: int) -> bytes:
    with path.open("rb") as f:
        f.seek(offset)
        return f.read(n)


# -- XIDs ------------------------------------------------------------------------------------------

RETRY_S = 5.0
MAX_RETRY_S = 300.0
MAX_GPUS = 256


class HelperXids:
    """The XIDs the helper streams from the kernel log, held for this boot (`run` follows them)."""

    def __init__(self, client: HelperClient, fallback: XidSource) -> None:
        self.client = client
        self.fallback = fallback
        self._held: dict[tuple[int, int, int], tuple[dict[str, Any], ...]] = {}
        self._seq = -1
        self.following = asyncio.Event()
        """Set once the helper has the kernel log open: `by_pci` knows from then on."""
        self.changed = asyncio.Event()
        """Set when an XID is taken (a waiter clears it)."""
        self.refused: str | None = None
        """The helper's sentence when it has no kmsg.follow (an older helper): the direct read stands in."""

    def by_pci(self) -> XidsByPci | None:
        if self.refused is not None:
            return self.fallback.by_pci()
        if not self.following.is_set():
            return None
        held = self._held  # replaced, never changed in place: a thread reads it whole
        return {k: list(v) for k, v in held.items()}

    def take(self, record: dict[str, Any]) -> None:
        """One streamed XID record (the helper built it; still checked: it is data)."""
        key = pci_key(str(record.get("pci", "")))
        xid, seq = record.get("xid"), record.get("seq")
        if key is None or not isinstance(xid, int) or (seq is not None and not isinstance(seq, int)):
            return
        if isinstance(seq, int):
            if seq <= self._seq:
                return
            self._seq = seq
        entry: dict[str, Any] = {"xid": xid, "message": str(record.get("text", ""))[:200]}
        if isinstance(record.get("uptime_s"), int | float):
            entry["uptime_s"] = record["uptime_s"]
        if key not in self._held and len(self._held) >= MAX_GPUS:
            return
        self._held = {**self._held, key: (*self._held.get(key, ()), entry)[-MAX_XIDS_PER_GPU:]}
        self.changed.set()

    async def run(self, stopped: asyncio.Event) -> None:
        """Follow the helper's stream until `stopped`; reconnect with back-off while the helper is away."""
        delay = RETRY_S
        while not stopped.is_set():
            try:
                async for item in self.client.stream("kmsg.follow", after_seq=self._seq):
                    if "following" in item:
                        self.following.set()
                        delay = RETRY_S
                        log.info("event=xids.following source=%s after_seq=%d", item["following"], self._seq)
                    else:
                        self.take(item)
            except HelperRefused as e:
                if "not in the helper's table" in str(e):
                    self.refused = str(e)
                    log.warning("event=xids.direct why=%r", str(e))
                    return
                log.warning("event=xids.unavailable error=%r retry_s=%g", str(e), delay)
            except HelperUnavailable as e:
                log.info("event=xids.unavailable error=%r retry_s=%g", str(e), delay)
            await wait_event(stopped, delay)
            delay = min(delay * 2, MAX_RETRY_S)
