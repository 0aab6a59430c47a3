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
  `host.hugepages` and `host.run`; their records are the agent's own state, kept under its data dir.
* `HelperSshdFiles` / `HelperSshdTools`: the access converger's files as `sshd.write` / `sshd.remove`, and
  `sshd.check` / `sshd.reload` (the KRL is still built by `ssh-keygen` in the agent: it needs no root).
* `HelperHardware`: a backend whose `reset_gpu` and `reboot` ask the helper (`gpu.reset`, `node.reboot`).
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agent.converge.access import read_managed
from agent.converge.host import RECORDS_DIR
from agent.converge.host_ops import HostOps
from agent.converge.sshd import SshdTools
from agent.helper.client import HelperClient, HelperError, HelperRefused
from agent.helper.ops import HOST_FILE_KEYS
from agent.hw.base import ActionDisabled, HardwareBackend, ProcessResult
from agent.hw.limits import Limits
from agent.hw.nvml import REBOOT_DISABLED, RESET_DISABLED
from agent.hw.slices import SystemdSlices
from agent.offload import Offload, to_thread

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
    """The host units' effects through the helper; their records (the agent's memory) under `state_root`."""

    def __init__(self, client: HelperClient, root: Path, state_root: Path, *, offload: Offload = to_thread) -> None:
        super().__init__(root, run=self._refuse_run, offload=offload)
        self.client = client
        self.state_root = state_root

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

    @staticmethod
    async def _refuse_run(argv: Sequence[str], *, timeout_s: float | None = None) -> ProcessResult:
        raise HelperRefused("helper: an unprivileged node runs no host command itself")


def _key(rel: str) -> str:
    key = HOST_FILE_KEYS.get(rel)
    if key is None:
        raise HelperRefused(f"helper: the helper has no file {rel}")
    return key


SSHD_KEYS = {"ca.pub": "ca", "revoked.krl": "krl", "revoked.krl.src": "krl-src", "sshd.conf": "dropin"}


def _sshd_args(rel: str) -> dict[str, str]:
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
