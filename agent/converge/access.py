"""The `access` converger: break-glass SSH files for sshd (reference "Break-glass SSH and tunnel keys").

One pass (`converge`):

1. The section becomes files (`agent.converge.access_files.desired`). A
   section that could add a line to sshd's files is FAILED terminally
   (`InvalidAccess`) and nothing is touched.
2. The files under the SSH directory are read and compared. Nothing
   changed and no reload owed: CONVERGED, no tool runs.
3. Otherwise the current files are kept in memory, the KRL is rebuilt if its
   inputs changed (`ssh-keygen -k`), every file is written (each one
   atomically, 0644) and what the section no longer names is removed.
4. `sshd -t -f <sshd_config>` judges the result. If it refuses, the files
   kept in step 3 are put back exactly and the section is FAILED terminally
   with sshd's message (the next pass tries again, as an operator may fix
   sshd_config meanwhile).
5. sshd is reloaded (`--sshd-reload-cmd`) only after a change it accepted. A
   failed reload is a retryable failure, and the reload stays owed until one
   succeeds, even when the next pass finds the files already in place; the
   debt is a file (`.reload-owed`, made before the first file is written), so
   an agent that dies between writing and reloading still reloads once it is
   back.

Blocking file work goes through the agent's offload, tools through the async
runner (`agent.converge.sshd`). The files are replaced through the `SshdFiles`
seam (directly here; through `bc helper` for an unprivileged node,
agent.helper.node_ops), and the reload debt and the KRL's scratch files live
in `state_dir` (the SSH directory itself unless told otherwise: an
unprivileged node keeps them in its data dir).
"""

from __future__ import annotations

import logging
import shlex
from pathlib import Path
from typing import Protocol

from google.protobuf.message import Message

from agent.converge import access_files as af
from agent.converge.run import CONVERGED, FAILED, SectionResult
from agent.converge.sshd import DEFAULT_RELOAD, SSHD_CONFIG, SshdTools, ToolError
from agent.offload import Offload, to_thread
from bc.protocol.pb import spec_pb2
from bc.runtime.files import atomic_write

log = logging.getLogger(__name__)

REASON_INVALID = "InvalidAccess"
REASON_SSHD_REFUSED = "SshdRefused"
REASON_WRITE = "AccessWriteFailed"
REASON_RELOAD = "SshdReloadFailed"
RELOAD_OWED = ".reload-owed"

Snapshot = dict[str, bytes]
"""Managed files by path under the SSH directory, with their bytes."""


def read_managed(ssh_dir: Path) -> Snapshot:
    """Every managed file under the SSH directory (blocking; through the offload)."""
    if not ssh_dir.is_dir():
        return {}
    found = [p.name for p in ssh_dir.iterdir() if p.is_file()]
    pdir = ssh_dir / af.PRINCIPALS_DIR
    if pdir.is_dir():
        found += [f"{af.PRINCIPALS_DIR}/{p.name}" for p in pdir.iterdir() if p.is_file()]
    return {rel: (ssh_dir / rel).read_bytes() for rel in af.managed(found)}


def write_managed(ssh_dir: Path, files: Snapshot) -> None:
    """Make the managed files exactly `files`: each written atomically (0644), the others removed."""
    if files:
        ssh_dir.mkdir(parents=True, exist_ok=True, mode=0o755)
        (ssh_dir / af.PRINCIPALS_DIR).mkdir(exist_ok=True, mode=0o755)
    for rel, data in files.items():
        atomic_write(ssh_dir / rel, data, 0o644, dir_mode=0o755)
    for rel in read_managed(ssh_dir):
        if rel not in files:
            (ssh_dir / rel).unlink()
    pdir = ssh_dir / af.PRINCIPALS_DIR
    if not files and pdir.is_dir() and not any(pdir.iterdir()):
        pdir.rmdir()


class SshdFiles(Protocol):
    async def replace(self, files: Snapshot) -> None:
        """Make the managed files exactly `files`, written in the dict's order, then the others removed."""
        ...


class DirectSshdFiles:
    def __init__(self, ssh_dir: Path, *, offload: Offload = to_thread) -> None:
        self.ssh_dir = ssh_dir
        self.offload = offload

    async def replace(self, files: Snapshot) -> None:
        await self.offload(write_managed, self.ssh_dir, files)


def _touch(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
    path.touch()


class AccessConverger:
    section = "access"

    def __init__(
        self,
        ssh_dir: Path,
        node_id: str,
        tools: SshdTools,
        *,
        offload: Offload = to_thread,
        files: SshdFiles | None = None,
        state_dir: Path | None = None,
    ) -> None:
        self.ssh_dir = ssh_dir
        self.node_id = node_id
        self.tools = tools
        self.offload = offload
        self.files = files or DirectSshdFiles(ssh_dir, offload=offload)
        self.state_dir = state_dir or ssh_dir

    @property
    def _owed_marker(self) -> Path:
        return self.state_dir / RELOAD_OWED

    async def converge(self, desired: Message, generation: int) -> SectionResult:
        assert isinstance(desired, spec_pb2.AccessSection)
        try:
            want = af.desired(desired, self.node_id, self.ssh_dir)
        except af.InvalidAccess as e:
            log.error("event=access.invalid generation=%d why=%s", generation, e)
            return SectionResult(FAILED, reason=REASON_INVALID, message=str(e), terminal=True)
        have = await self.offload(read_managed, self.ssh_dir)
        target = dict(want.files)
        if not want.empty:
            target[af.KRL_SOURCE_FILE] = want.krl_source()
            if have.get(af.KRL_SOURCE_FILE) == target[af.KRL_SOURCE_FILE] and af.KRL_FILE in have:
                target[af.KRL_FILE] = have[af.KRL_FILE]
        if target != have:
            failed = await self._apply(want, target, have, generation)
            if failed is not None:
                return failed
        if await self.offload(self._owed_marker.exists):
            try:
                await self.tools.reload()
            except (ToolError, OSError) as e:
                log.warning("event=access.reload-failed generation=%d error=%s", generation, e)
                return SectionResult(FAILED, reason=REASON_RELOAD, message=str(e))
            await self.offload(self._owed_marker.unlink, missing_ok=True)
            log.info("event=access.reloaded generation=%d", generation)
        return SectionResult(CONVERGED)

    async def _apply(
        self, want: af.AccessFiles, target: Snapshot, have: Snapshot, generation: int
    ) -> SectionResult | None:
        """Write `target`, let sshd judge it, and put `have` back when sshd refuses; None when it is in place."""
        owed_before = await self.offload(self._owed_marker.exists)
        try:
            if not want.empty and af.KRL_FILE not in target:
                target[af.KRL_FILE] = await self.tools.build_krl(await self._scratch(), want.ca_keys, want.krl_spec())
            await self.offload(_touch, self._owed_marker)  # before any file changes: see step 5
            # The KRL is written before its source, in one pass: a reader that sees the source sees the KRL.
            order = sorted(target, key=lambda rel: rel == af.KRL_SOURCE_FILE)
            await self.files.replace({rel: target[rel] for rel in order})
        except (ToolError, OSError) as e:
            await self._restore(have, owed_before)
            log.warning("event=access.write-failed generation=%d error=%s", generation, e)
            return SectionResult(FAILED, reason=REASON_WRITE, message=str(e))
        try:
            refused = await self.tools.check()
        except (ToolError, OSError) as e:
            refused = str(e)
        if refused is not None:
            await self._restore(have, owed_before)
            # The previous files are back: sshd has nothing new to load, unless a reload was owed before.
            log.error("event=access.sshd-refused generation=%d message=%s", generation, refused)
            return SectionResult(FAILED, reason=REASON_SSHD_REFUSED, message=refused, terminal=True)
        log.info("event=access.applied generation=%d files=%d serials=%d", generation, len(target), len(want.serials))
        return None

    async def _scratch(self) -> Path:
        await self.offload(self.state_dir.mkdir, parents=True, exist_ok=True, mode=0o755)
        return self.state_dir

    async def _restore(self, have: Snapshot, owed_before: bool) -> None:
        """Put the files back as they were; a reload is owed afterwards only if it was before."""
        try:
            await self.files.replace(have)
            if not owed_before:
                await self.offload(self._owed_marker.unlink, missing_ok=True)
        except OSError as e:  # the next pass writes again; say so loudly
            log.error("event=access.restore-failed error=%s", e)


def access_converger(
    ssh_dir: Path,
    node_id: str,
    *,
    sshd_config: Path | None,
    reload_cmd: str | None,
    fake_host: bool,
    offload: Offload = to_thread,
) -> AccessConverger:
    """The converger as `bc node` builds it from its flags: `reload_cmd` None is `systemctl reload ssh` on a
    real host and nothing on a fake one; an empty string is nothing."""
    if reload_cmd is None:
        argv: tuple[str, ...] = () if fake_host else DEFAULT_RELOAD
    else:
        argv = tuple(shlex.split(reload_cmd))
    tools = SshdTools(sshd_config=sshd_config or SSHD_CONFIG, reload_cmd=argv, offload=offload)
    return AccessConverger(ssh_dir, node_id, tools, offload=offload)
