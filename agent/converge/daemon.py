"""The `daemon` section: the release this node should run, converged through the self-update controller.

Empty: CONVERGED. On a node with no A/B slot (a zipapp, a checkout, a binary run directly) a non-empty
section is UNSUPPORTED (terminal, reason `no-slots`). Otherwise: the running version is the section's and no
swap is pending → CONVERGED; a swap is unconfirmed → PROGRESSING; else the upgrade starts in the background
(the same path as `daemon.upgrade`, agent.upgrade.controller) and the section is PROGRESSING until the
process restarts onto the new release — or FAILED (terminal) with the refusal's reason (not-newer,
wrong-platform, wrong-name, failed-before, bad-release, download-failed, version-mismatch).

A refused release is reported once and never tried in a loop: a later pass, a new generation or a restart
of the agent answers the same (name, sequence) with the refusal the controller remembers in upgrade.json,
without a download, until the section names another release.

On an unprivileged node the swap is `bc helper`'s (agent.helper.node_ops.HelperSlots): its refusal is the
section's FAILED `helper-refused` with the helper's sentence; a helper that is down leaves the section
PROGRESSING (`helper-unavailable`, a retryable failure) and the next pass tries again.
"""

from __future__ import annotations

import asyncio
import logging

from google.protobuf.message import Message

from agent.converge.run import CONVERGED, FAILED, PROGRESSING, UNSUPPORTED, SectionResult
from agent.kind_result import KindResult
from agent.upgrade.controller import HELPER_UNAVAILABLE, NO_SLOTS, NO_SLOTS_MESSAGE, Upgrader
from bc.pki.releases import upgrade_request
from bc.protocol.pb import spec_pb2

log = logging.getLogger(__name__)


class DaemonConverger:
    section = "daemon"

    def __init__(self, upgrader: Upgrader | None, running_version: str) -> None:
        self.upgrader = upgrader
        self.running_version = running_version
        self._task: asyncio.Task[KindResult] | None = None
        self._release = b""
        self._failed: dict[bytes, KindResult] = {}
        """This process's failures by the section's exact bytes: a forged section fails here and cannot stand
        for the real release of the same (name, sequence); authentic refusals are remembered on disk too."""

    async def converge(self, section: Message, generation: int) -> SectionResult:
        desired = section if isinstance(section, spec_pb2.DaemonSection) else spec_pb2.DaemonSection()
        if not desired.version:
            return SectionResult(CONVERGED)
        if self.upgrader is None:
            return SectionResult(UNSUPPORTED, reason=NO_SLOTS, message=NO_SLOTS_MESSAGE, terminal=True)
        if self.upgrader.upgrade_only:
            return SectionResult(PROGRESSING, reason="unconfirmed", message="waiting for the first Welcome")
        if desired.version == self.running_version:
            return SectionResult(CONVERGED)
        release = desired.SerializeToString(deterministic=True)
        if release in self._failed:
            r = self._failed[release]
            return SectionResult(FAILED, reason=r.reason, message=r.message, terminal=True)
        seen = self.upgrader.remembered(desired)
        if seen is not None and self._task is None:  # refused before this process started: not tried again
            return SectionResult(FAILED, reason=seen.reason, message=seen.message, terminal=True)
        if self._task is not None and self._task.done() and self._release == release:
            result = self._task.result()
            self._task = None
            if not result.ok and result.reason == HELPER_UNAVAILABLE:  # nothing swapped: the next pass tries again
                return SectionResult(FAILED, reason=result.reason, message=result.message, terminal=False)
            if not result.ok:
                self._failed[release] = result
                return SectionResult(FAILED, reason=result.reason, message=result.message, terminal=True)
        if self._task is None or self._release != release:
            req = upgrade_request(desired)
            log.info("event=daemon.section-upgrade version=%s generation=%d", desired.version, generation)
            self._release = release
            self._task = asyncio.create_task(self.upgrader.upgrade("", req), name="daemon-section-upgrade")
        return SectionResult(PROGRESSING, reason="upgrading", message=f"installing release {desired.version}")
