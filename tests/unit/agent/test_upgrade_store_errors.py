"""The self-update controller over a store that refuses or is away, as the helper-backed one can be.

A step that must happen (here, the abort a start finds due) waits for the store and happens once it is back; a
refusal fails the upgrade `helper-refused` with the store's sentence and a store that is away fails it
`helper-unavailable`, which the `daemon` section reports as PROGRESSING, to be tried again.
"""

from __future__ import annotations

import asyncio
import hashlib
from dataclasses import replace
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric import ed25519

from agent.converge.daemon import DaemonConverger
from agent.converge.run import FAILED, PROGRESSING
from agent.offload import inline
from agent.upgrade import swap_rules as sr
from agent.upgrade.controller import HELPER_REFUSED, HELPER_UNAVAILABLE, Upgrader
from agent.upgrade.slots import Slots, SlotsRefused, SlotsUnavailable, install, read_disk, write_record
from bc.pki import releases
from bc.pki.releases import upgrade_request
from bc.protocol.pb import spec_pb2
from bc.seams.clock import LoopClock

KEY = ed25519.Ed25519PrivateKey.generate()


class Flaky(Slots):
    """The real install dir, behind a store that fails its first `failures` steps with `error`."""

    def __init__(self, install_dir: Path, error: OSError, failures: int) -> None:
        super().__init__(install_dir, inline)
        self.error, self.failures, self.steps = error, failures, 0

    async def take(self, disk: sr.Disk, step: sr.Step, plan: sr.Plan | None = None) -> sr.Disk:
        self.steps += 1
        if self.steps <= self.failures:
            raise self.error
        return await super().take(disk, step, plan)


def upgrader(store: Slots) -> Upgrader:
    async def restart() -> None:
        raise AssertionError("nothing is swapped here")

    return Upgrader(
        store,
        running_version="1.0.0",
        clock=LoopClock(),
        boot_id="boot-1",
        ca_pem=b"",
        release_keys=lambda: [releases.public_bytes(KEY)],
        restart=restart,
        offload=inline,
        platform="linux-x86_64",
    )


def section() -> spec_pb2.DaemonSection:
    rel = releases.Release("bc", "1.1.0", 1, "linux-x86_64", hashlib.sha256(b"x").hexdigest(), 1)
    return spec_pb2.DaemonSection(
        name="bc",
        version=rel.version,
        url="https://releases.example/bc",
        sha256=rel.sha256,
        signature=releases.sign(KEY, rel),
        sequence=rel.sequence,
        size=rel.size,
        platform=rel.platform,
    )


async def test_an_abort_due_at_start_waits_for_the_store_and_then_happens(tmp_path: Path) -> None:
    install(tmp_path / "opt", b"old", version="1.0.0")
    record = read_disk(tmp_path / "opt").record  # ARM was taken, the process died before SWITCH
    write_record(tmp_path / "opt", replace(record, state="pending", command_id="c1", version="1.1.0", sequence=1))
    store = Flaky(tmp_path / "opt", SlotsUnavailable("helper: cannot reach /run/bc-helper/helper.sock"), 3)
    decision = await upgrader(store).start()  # virtual time: each wait of STEP_RETRY_S passes at once
    assert decision.start is sr.Start.ABORT and store.steps == 4
    assert read_disk(tmp_path / "opt").record.state == "aborted"


async def test_a_refusing_store_fails_the_upgrade_with_its_sentence_and_an_absent_one_leaves_it_retryable(
    tmp_path: Path,
) -> None:
    install(tmp_path / "opt", b"old", version="1.0.0")
    refused = upgrader(Flaky(tmp_path / "opt", SlotsRefused("helper: refused: update.stage: no."), 1))
    await refused.start()
    result = await refused.upgrade("c1", upgrade_request(section()))
    assert (result.ok, result.reason, result.message) == (False, HELPER_REFUSED, "helper: refused: update.stage: no.")

    away = upgrader(Flaky(tmp_path / "opt", SlotsUnavailable("helper: cannot reach h.sock"), 1))
    await away.start()
    converger = DaemonConverger(away, "1.0.0")
    first = await converger.converge(section(), 1)
    assert (first.state, first.reason) == (PROGRESSING, "upgrading")
    await next(t for t in asyncio.all_tasks() if t.get_name() == "daemon-section-upgrade")
    second = await converger.converge(section(), 1)
    assert (second.state, second.reason, second.terminal) == (FAILED, HELPER_UNAVAILABLE, False)
    assert second.reported_state == PROGRESSING and second.message == "helper: cannot reach h.sock"
    assert read_disk(tmp_path / "opt").record.refused is None  # nothing remembered: the next pass tries again
