"""The dispatcher's self-update seams: an unconfirmed new binary runs daemon.upgrade only, and the command whose
swap the controller settles is neither recovered as interrupted nor run again."""

from __future__ import annotations

from pathlib import Path

from agent.journal_rules import Acceptance
from agent.memory_journal import MemoryJournal
from bc.protocol.pb import kinds_pb2
from tests.unit.agent.test_dispatch import NOW_MS, Harness, command


async def test_an_upgrade_only_session_refuses_every_other_kind(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    h.d.upgrade_only = lambda: True
    await h.d.start()
    try:
        await h.d.on_command(command("c1", "inventory.refresh"))
        await h.wait_state("c1", "COMMAND_REJECTED")
        assert h.updates("c1") == [("COMMAND_REJECTED", "UNSUPPORTED")]
        # daemon.upgrade still runs (here without slots: it fails no-slots rather than being refused)
        await h.d.on_command(
            command(
                "c2",
                "daemon.upgrade",
                kinds_pb2.DaemonUpgradeRequest(version="1.2.0", url="https://h/x", sha256="ab" * 32, size=1),
            )
        )
        await h.wait_state("c2", "COMMAND_FAILED")
        assert h.updates("c2")[-1] == ("COMMAND_FAILED", "no-slots")
    finally:
        await h.d.stop()


async def test_a_held_command_is_not_recovered_and_redelivery_reports_running(tmp_path: Path) -> None:
    journal = MemoryJournal()
    now = NOW_MS / 1000
    await journal.accept(Acceptance("up-1", "daemon.upgrade", False, True, "inc-0", "boot-1", b"", now))
    await journal.mark_running("up-1", "inc-0", "boot-1", now)
    h = Harness(tmp_path)
    h.journal = journal
    h.d.journal = journal
    h.d.held = lambda cid: cid == "up-1"
    settlements = await h.d.start()
    try:
        assert settlements == []  # not settled `interrupted`: the controller decides from upgrade.json
        await h.d.on_command(command("up-1", "daemon.upgrade"))
        assert h.updates("up-1") == [("COMMAND_RUNNING", "")]
        entry = await journal.get_command("up-1")
        assert entry is not None and entry.state == "running"
    finally:
        await h.d.stop()
