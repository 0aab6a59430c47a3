"""The self-update controller: one per `bc node` that runs from an A/B install (agent.upgrade.slots).

At start (`start`, before the dispatcher) it reads the slots and upgrade.json,
asks `swap_rules.on_start` what to do and does it: run, run upgrade-only until
the first Welcome, finish a rollback, or roll back and restart. The command
that caused the swap stays held (`holds`): the dispatcher neither recovers it
as interrupted nor runs it again, and the controller settles it — SUCCEEDED
when the new binary is welcomed (CONFIRM, the floor raised), FAILED
`update-failed` from the old binary after a rollback.

`upgrade` is `daemon.upgrade` (and the `daemon` section): refuse while a swap
is unconfirmed; check the release's signature (over name, version,
sequence, platform, sha256 and size) against the trust bundle's release keys
before a byte is fetched; refuse what the record forbids (`swap_rules.refusal`:
another platform or release name, a sequence at or below the one this node
runs, a version that failed before); download it (agent.upgrade.download),
check its sha256 and size, run its own `--version` in the install dir
(agent.upgrade.version_check) and refuse it unless it names the release's
version; then PLACE, ARM, SWITCH and restart. Nothing is swapped unless every
check held.

A release refused or failed once its signature held is remembered in the
record (`Record.refused`): offered again with the same (name, sequence), it is
answered with that refusal, without a download, until another release is
offered. An explicit `daemon.upgrade` command (not the `daemon` section)
tries a release whose download failed again: that is an operator's retry,
not a loop.

Restart: `restart_process` re-executes `current` (under --fake-hw and when
no systemd started us), or exits with status 75 for systemd's
`Restart=always` to start `current` again.

The install dir is reached through a `SlotStore` (agent.upgrade.slots): the
agent's own writes (`Slots`), or `bc helper`'s for an unprivileged node
(agent.helper.node_ops.HelperSlots), which verifies the release again itself
before it places it. The helper's refusal fails the upgrade `helper-refused`
with its sentence (remembered like any refusal; an explicit `daemon.upgrade`
tries it again, as an operator who fixed the helper's roots would); a helper
that is down fails it `helper-unavailable`, not remembered: the `daemon`
section stays PROGRESSING and tries again on its next pass. The start, the
confirm and the rollback wait for a helper that is down, retrying every
`STEP_RETRY_S`: they must happen, whenever they can.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

from agent.kind_result import KindResult
from agent.offload import Offload, to_thread
from agent.upgrade import download as dl
from agent.upgrade import version_check
from agent.upgrade.slots import CURRENT, SlotsRefused, SlotStore, SlotsUnavailable
from agent.upgrade.swap_rules import (
    ROLLBACK,
    UPDATE_FAILED,
    VERSION_MISMATCH,
    Disk,
    Installed,
    Offer,
    Plan,
    Refused,
    Start,
    StartDecision,
    Step,
    already_running,
    on_start,
    refusal,
    remembered,
    unsettled,
)
from bc.pki import releases
from bc.protocol.canonical import canonical_json
from bc.protocol.pb import kinds_pb2, session_pb2
from bc.protocol.pb.session_pb2 import CommandUpdate
from bc.runtime.aio import wait_event
from bc.seams.clock import Clock

log = logging.getLogger(__name__)

CONFIRM_S = 120.0
RESTART_EXIT = 75
BAD_RELEASE = "bad-release"
DOWNLOAD_FAILED = "download-failed"
NO_SLOTS = "no-slots"
NO_SLOTS_MESSAGE = "this node runs from a zipapp or a checkout: there is no A/B slot to swap"
HELPER_REFUSED = "helper-refused"
HELPER_UNAVAILABLE = "helper-unavailable"
RETRIED_BY_COMMAND = frozenset({DOWNLOAD_FAILED, HELPER_REFUSED})
"""Refusals an explicit `daemon.upgrade` tries again (an operator's retry, not a loop)."""
STEP_RETRY_S = 2.0

Settle = Callable[[str, CommandUpdate], Awaitable[None]]


class UpgradeRefused(Exception):
    """This binary must not run (its slot is below the release floor): one sentence."""


PAUSE_ENV = "BC_TEST_UPGRADE_PAUSE_AFTER"
"""Test-only, honoured under --fake-hw alone: stop after this swap step (e.g. `arm`) and wait there, so a test
can kill -9 the process exactly between two steps (tests/e2e/test_self_update.py). Never inherited by a re-exec."""


@dataclass(frozen=True)
class UpgradeConfig:
    confirm_s: float = CONFIRM_S
    guard: dl.StallGuard = field(default_factory=dl.StallGuard)
    pause_after: Step | None = None
    """Test-only (PAUSE_ENV): after this step the swap waits forever instead of going on."""


class Upgrader:
    def __init__(
        self,
        slots: SlotStore,
        *,
        running_version: str,
        clock: Clock,
        boot_id: str,
        ca_pem: bytes,
        release_keys: Callable[[], list[bytes]],
        restart: Callable[[], Awaitable[None]],
        config: UpgradeConfig | None = None,
        offload: Offload = to_thread,
        platform: str = "",
    ) -> None:
        self.slots = slots
        self.platform = platform or releases.host_platform()
        self.running_version = running_version
        self.clock, self.boot_id, self.ca_pem = clock, boot_id, ca_pem
        self.release_keys = release_keys
        self.restart = restart
        self.config = config or UpgradeConfig()
        self.offload = offload
        self.disk: Disk | None = None
        self.decision = StartDecision(Start.RUN, ())
        self.held = ""
        self.settle: Settle | None = None
        self._lock = asyncio.Lock()

    # -- start ---------------------------------------------------------------
    async def start(self) -> StartDecision:
        """Decide from the disk what this process is, and take the steps that decision needs now."""
        disk = await self.slots.read()
        d = on_start(disk, self.clock.now())
        log.info(
            "event=upgrade.start slot=%s version=%s record=%s decision=%s why=%r",
            disk.current,
            self.running_version,
            disk.record.state,
            d.start.value,
            d.why,
        )
        if d.start is Start.REFUSE:
            raise UpgradeRefused(f"refusing to run: {d.why}")
        for step in d.steps:
            disk = await self._take_when_possible(disk, step)
        self.disk, self.decision = disk, d
        if d.settle is not None or d.start is Start.PENDING:
            self.held = disk.record.command_id
        return d

    @property
    def must_restart(self) -> bool:
        """A rollback ran at start: this process restarts onto the old binary instead of running."""
        return self.decision.start is Start.ROLL_BACK

    @property
    def upgrade_only(self) -> bool:
        """Until the first Welcome confirms it, a new binary runs only `daemon.upgrade`."""
        return self.disk is not None and self.disk.record.state == "pending"

    @property
    def slot(self) -> str:
        return self.disk.current if self.disk is not None else ""

    def holds(self, command_id: str) -> bool:
        return bool(self.held) and command_id == self.held

    async def report_start(self) -> None:
        """Settle the held command when the start decided its outcome (a rollback, an abort, a confirm)."""
        if self.decision.settle is not None and self.disk is not None:
            outcome, reason = self.decision.settle
            await self._settle(outcome, reason, self.decision.why)

    async def _settle(self, outcome: str, reason: str, why: str) -> None:
        assert self.disk is not None
        r = self.disk.record
        cid = r.command_id
        if not cid or self.settle is None:
            return
        result = canonical_json({"version": r.version, "slot": self.disk.current, "running": self.running_version})
        if outcome == "succeeded":
            update = CommandUpdate(
                command_id=cid,
                state=session_pb2.COMMAND_SUCCEEDED,
                message=f"running release {r.version} from slot {self.disk.current}",
                result=result.encode(),
                boot_id=self.boot_id,
            )
        else:
            message = (
                f"release {r.version} was not confirmed within {self.config.confirm_s:g} s and was rolled back"
                if reason == UPDATE_FAILED
                else f"the agent stopped before switching to release {r.version}; it may be tried again"
            )
            update = CommandUpdate(
                command_id=cid,
                state=session_pb2.COMMAND_FAILED,
                reason=reason,
                message=message,
                result=result.encode(),
                boot_id=self.boot_id,
            )
        self.held = ""
        log.info("event=upgrade.settled command=%s outcome=%s reason=%s why=%r", cid, outcome, reason, why)
        await self.settle(cid, update)

    # -- confirm or roll back ----------------------------------------------
    async def watch(self, welcomed: asyncio.Event) -> None:
        """While pending: CONFIRM on the first Welcome, or roll back at the deadline and restart."""
        if self.disk is None or self.disk.record.state != "pending":
            return
        remaining = self.disk.record.deadline - self.clock.now()
        if not await wait_event(welcomed, max(0.0, remaining)):
            log.error("event=upgrade.unconfirmed version=%s; rolling back", self.disk.record.version)
            disk = self.disk
            for step in ROLLBACK:
                if step is not Step.RESTART:
                    disk = await self._take_when_possible(disk, step)
            self.disk = disk
            await self.restart()
            return
        self.disk = await self._take_when_possible(self.disk, Step.CONFIRM)
        log.info("event=upgrade.confirmed version=%s floor=%d", self.disk.record.version, self.disk.record.floor)
        await self._settle("succeeded", "", "confirmed")

    async def _take_when_possible(self, disk: Disk, step: Step) -> Disk:
        """A step that must happen (start, confirm, rollback): while the helper is down, wait and try again."""
        while True:
            try:
                return await self.slots.take(disk, step)
            except SlotsUnavailable as e:
                log.warning("event=upgrade.step-waiting step=%s retry_s=%g error=%r", step.value, STEP_RETRY_S, str(e))
                await asyncio.sleep(STEP_RETRY_S)

    async def _maybe_pause(self, step: Step) -> None:
        if self.config.pause_after is step:
            log.warning("event=upgrade.paused step=%s (test-only %s)", step.value, PAUSE_ENV)
            await _never()

    # -- daemon.upgrade ----------------------------------------------------
    async def upgrade(self, command_id: str, req: kinds_pb2.DaemonUpgradeRequest) -> KindResult:
        async with self._lock:
            return await self._upgrade(command_id, req)

    def remembered(self, req: releases.ReleaseFields) -> Refused | None:
        """The refusal this node keeps for this release's (name, sequence), from the record read last."""
        if self.disk is None:
            return None
        r = releases.release_of(req)
        return remembered(self.disk.record, Offer(r.name, r.version, r.sequence, r.platform))

    async def _upgrade(self, command_id: str, req: kinds_pb2.DaemonUpgradeRequest) -> KindResult:
        disk = await self.slots.read()
        self.disk = disk
        if (busy := unsettled(disk.record)) is not None:
            return KindResult.failure(*busy)
        release = releases.release_of(req)
        try:
            dl.check_https(req.url)
            releases.verify(self.release_keys(), release, req.signature)
        except (dl.DownloadError, releases.BadRelease) as e:
            # Not remembered: fields no key vouched for name no release, and must not block the real one.
            return KindResult.failure(BAD_RELEASE, str(e))
        offer = Offer(release.name, release.version, release.sequence, release.platform)
        if already_running(disk.record, disk.current, offer):
            return KindResult.success({"version": req.version, "slot": disk.current, "swapped": False})
        seen = remembered(disk.record, offer)
        if seen is not None and not (command_id and seen.reason in RETRIED_BY_COMMAND):
            log.info(
                "event=upgrade.refused-before name=%s sequence=%d reason=%s", seen.name, seen.sequence, seen.reason
            )
            return KindResult.failure(seen.reason, seen.message)
        why = refusal(disk.record, disk.current, offer, self.platform)
        if why is not None:
            return await self._refuse(disk, offer, *why)
        try:
            return await self._install(disk, offer, command_id, req, release)
        except SlotsUnavailable as e:  # nothing was swapped: the section tries again on its next pass
            log.warning("event=upgrade.helper-unavailable version=%s error=%r", req.version, str(e))
            return KindResult.failure(HELPER_UNAVAILABLE, str(e))
        except SlotsRefused as e:  # a step before the release itself was judged (the release's are remembered)
            log.warning("event=upgrade.helper-refused version=%s error=%r", req.version, str(e))
            return KindResult.failure(HELPER_REFUSED, str(e))

    async def _install(
        self, disk: Disk, offer: Offer, command_id: str, req: kinds_pb2.DaemonUpgradeRequest, release: releases.Release
    ) -> KindResult:
        """Download, check, place, arm, switch and restart (every check before the first change that counts)."""
        disk = await self.slots.remember(disk, None)  # another release is offered: the last refusal is done with
        plan = Plan(command_id, req.version, req.sequence, self.clock.now() + self.config.confirm_s, release.name)
        disk = await self.slots.take(disk, Step.STAGE, plan)
        await self._maybe_pause(Step.STAGE)
        partial = self.slots.partial_path(disk)
        try:
            got = await dl.download(
                req.url,
                partial,
                ca_pem=self.ca_pem,
                max_size=req.size,
                guard=self.config.guard,
                clock=self.clock,
                offload=self.offload,
            )
        except dl.DownloadError as e:
            return await self._refuse(disk, offer, DOWNLOAD_FAILED, str(e))
        if (got.sha256, got.size) != (req.sha256, req.size):
            await self.offload(partial.unlink, True)
            return await self._refuse(
                disk,
                offer,
                BAD_RELEASE,
                f"the download is {got.size} bytes with sha256 {got.sha256[:16]}…,"
                f" not the release's {req.size} bytes with sha256 {req.sha256[:16]}…",
            )
        wrong = await self._check_version(partial, req.version)
        if wrong is not None:
            await self.offload(partial.unlink, True)
            return await self._refuse(disk, offer, VERSION_MISMATCH, wrong)
        if disk.current not in disk.record.slots:
            disk = _remember_running(disk, self.running_version)
        plan = Plan(command_id, req.version, req.sequence, self.clock.now() + self.config.confirm_s, release.name)
        try:
            disk = await self.slots.place(disk, plan, release, req.signature)
        except SlotsRefused as e:
            return await self._refuse(disk, offer, HELPER_REFUSED, str(e))
        await self._maybe_pause(Step.PLACE)
        switched = await self._arm_and_switch(disk, plan)
        if isinstance(switched, KindResult):
            return switched
        self.disk = disk = switched
        log.warning(
            "event=upgrade.switched command=%s version=%s slot=%s deadline_s=%g; restarting",
            command_id,
            req.version,
            disk.current,
            self.config.confirm_s,
        )
        await self.restart()
        await asyncio.Future()  # the process is gone (or, in a test, being stopped)
        raise AssertionError("unreachable")  # pragma: no cover

    async def _arm_and_switch(self, disk: Disk, plan: Plan) -> Disk | KindResult:
        """ARM, then SWITCH; if the store refuses or goes away between them, the swap is aborted where it can be
        (else the next start aborts it: `current` still names the old slot)."""
        armed = False
        try:
            for step in (Step.ARM, Step.SWITCH):
                disk = await self.slots.take(disk, step, plan)
                armed = True
                await self._maybe_pause(step)
        except (SlotsRefused, SlotsUnavailable) as e:
            self.disk = disk
            if armed:
                try:
                    self.disk = await self.slots.take(disk, Step.ABORT)
                except (SlotsRefused, SlotsUnavailable) as again:
                    log.warning("event=upgrade.abort-failed error=%r", str(again))
            reason = HELPER_UNAVAILABLE if isinstance(e, SlotsUnavailable) else HELPER_REFUSED
            log.warning("event=upgrade.switch-failed step=%s error=%r", "switch" if armed else "arm", str(e))
            return KindResult.failure(reason, str(e))
        return disk

    async def _check_version(self, staged: Path, version: str) -> str | None:
        """One sentence when the staged binary's own `--version` is not the release's version."""
        await self.offload(os.chmod, staged, 0o755)
        try:
            output = await version_check.staged_version_output(staged)
        except version_check.VersionCheckFailed as e:
            return f"{e}; it was not swapped in"
        return version_check.mismatch(output, version)

    async def _refuse(self, disk: Disk, offer: Offer, reason: str, message: str) -> KindResult:
        """Refuse `offer` and remember it (upgrade.json), so the same (name, sequence) is not tried again."""
        refused = Refused(offer.name, offer.sequence, offer.version, reason, message)
        try:
            self.disk = await self.slots.remember(disk, refused)
        except (SlotsRefused, SlotsUnavailable) as e:  # reported all the same; only not remembered
            log.warning("event=upgrade.not-remembered reason=%s error=%r", reason, str(e))
        log.warning(
            "event=upgrade.refused name=%s version=%s sequence=%d reason=%s message=%r",
            offer.name,
            offer.version,
            offer.sequence,
            reason,
            message,
        )
        return KindResult.failure(reason, message)


async def _never() -> None:
    await asyncio.Future()


def _remember_running(disk: Disk, version: str) -> Disk:
    from dataclasses import replace

    slots = dict(disk.record.slots)
    slots[disk.current] = Installed(version, 0)
    return replace(disk, record=replace(disk.record, slots=slots))


def restart_process(install_dir: Path, *, reexec: bool) -> NoReturn:
    """Start `current` again: re-exec it (fake hardware, no systemd), or exit for systemd to restart it."""
    logging.shutdown()
    if not reexec:
        os._exit(RESTART_EXIT)
    current = str(install_dir / CURRENT)
    # A one-file PyInstaller binary that starts another must not hand it its own unpacked environment.
    env = {**os.environ, "PYINSTALLER_RESET_ENVIRONMENT": "1"}
    env.pop(PAUSE_ENV, None)
    os.execve(current, [current, *sys.argv[1:]], env)


def test_pause_after(fake_hw: str | None) -> Step | None:
    """The PAUSE_ENV step, read under fake hardware only (a real host ignores it); UsageError-free: an unknown
    value pauses nowhere."""
    value = os.environ.get(PAUSE_ENV, "")
    if fake_hw is None or not value:
        return None
    return next((s for s in Step if s.value == value), None)
