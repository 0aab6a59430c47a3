"""The agent's dispatcher over the in-memory journal: acceptance order, duplicates, credits, cancel."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable
from pathlib import Path

import pytest
from google.protobuf import any_pb2

from agent.dispatch import ACK_WRITE_AFTER_S, Dispatcher
from agent.hw.fake import FakeHardware
from agent.kinds.base import KindContext
from agent.memory_journal import MemoryJournal
from bc.protocol.pb import common_pb2, kinds_pb2, session_pb2
from bc.protocol.pb.session_pb2 import CommandBody, NodeMessage
from bc.testing import virtual_clock

NOW_MS = 1_800_000_000_000


class Harness:
    def __init__(self, tmp: Path, *, bad_signature: bool = False) -> None:
        self.sent: list[NodeMessage] = []
        self.changed = asyncio.Event()
        self.journal = MemoryJournal()
        self.hw = FakeHardware("hgx-h100-8", "n1", state_dir=tmp)
        self.applied = 1
        self.clock = virtual_clock(NOW_MS / 1000)

        async def not_full() -> bool:
            return False

        self.d = Dispatcher(
            node_id="n1",
            role="node",
            journal=self.journal,
            journal_full=not_full,
            send=self.send,
            ctx=KindContext(node_id="n1", data_dir=tmp, hw=self.hw, cdi_dir=tmp / "cdi", boot_id="boot-1"),
            clock=self.clock,
            incarnation_id="inc-1",
            boot_id="boot-1",
            applied_generation=lambda: self.applied,
            server_now_ms=lambda: int(self.clock.now() * 1000),
            signature_check=(lambda cmd, body: "BAD_SIGNATURE") if bad_signature else (lambda cmd, body: None),
        )

    async def send(self, msg: NodeMessage) -> None:
        self.sent.append(msg)
        self.changed.set()

    def updates(self, cid: str) -> list[tuple[str, str]]:
        return [
            (session_pb2.CommandState.Name(m.command_update.state), m.command_update.reason)
            for m in self.sent
            if m.WhichOneof("msg") == "command_update" and m.command_update.command_id == cid
        ]

    async def wait_state(self, cid: str, state: str) -> None:
        async def until() -> None:
            while not any(s == state for s, _ in self.updates(cid)):
                self.changed.clear()
                await self.changed.wait()

        await asyncio.wait_for(until(), 5)


def command(
    cid: str,
    kind: str,
    payload: object | None = None,
    *,
    node: str = "n1",
    not_after_ms: int = NOW_MS + 60_000,
    min_generation: int = 0,
) -> session_pb2.Command:
    body = CommandBody(id=cid, node_id=node, kind=kind, not_after_ms=not_after_ms, min_generation=min_generation)
    if payload is not None:
        a = any_pb2.Any()
        a.Pack(payload)  # type: ignore[arg-type]
        body.payload.CopyFrom(a)
    return session_pb2.Command(envelope=common_pb2.Envelope(purpose="command", body=body.SerializeToString()))


@pytest.fixture
async def h(tmp_path: Path) -> AsyncIterator[Harness]:
    harness = Harness(tmp_path)
    await harness.d.start()
    try:
        yield harness
    finally:
        await harness.d.stop()


async def test_a_command_runs_and_reports_acked_running_succeeded(h: Harness) -> None:
    await h.d.on_command(command("c1", "inventory.refresh"))
    await h.wait_state("c1", "COMMAND_SUCCEEDED")
    assert [s for s, _ in h.updates("c1")] == ["COMMAND_ACKED", "COMMAND_RUNNING", "COMMAND_SUCCEEDED"]


async def test_a_duplicate_delivery_runs_once(h: Harness) -> None:
    gpu = h.hw.inventory().gpus[0].uuid
    cmd = command("c1", "gpu.reset", kinds_pb2.GpuResetRequest(gpu_uuids=[gpu]))
    await h.d.on_command(cmd)
    await h.d.on_command(cmd)  # while in flight: re-attach
    await h.wait_state("c1", "COMMAND_SUCCEEDED")
    await h.d.on_command(cmd)  # after: the stored result again
    assert FakeHardware.read_resets(h.hw.state_dir) == {gpu: 1}  # type: ignore[arg-type]
    assert [s for s, _ in h.updates("c1")].count("COMMAND_SUCCEEDED") == 2


async def test_acceptance_order(h: Harness) -> None:
    await h.d.on_command(command("other", "inventory.refresh", node="n2"))
    await h.d.on_command(command("unknown", "no.such.kind"))
    await h.d.on_command(command("site-only", "bmc.query"))
    await h.d.on_command(command("late", "inventory.refresh", not_after_ms=NOW_MS - 1))
    await h.d.on_command(command("stale", "inventory.refresh", not_after_ms=NOW_MS - 1, min_generation=9))
    assert h.updates("other") == [("COMMAND_REJECTED", "UNSUPPORTED")]
    assert h.updates("unknown") == [("COMMAND_REJECTED", "UNSUPPORTED")]
    assert h.updates("site-only") == [("COMMAND_REJECTED", "UNSUPPORTED")]
    assert h.updates("late") == [("COMMAND_REJECTED", "EXPIRED")]
    assert h.updates("stale") == [("COMMAND_REJECTED", "STALE_GENERATION")]
    # Terminal rejections are journaled: a duplicate delivery gets the same answer.
    await h.d.on_command(command("late", "inventory.refresh", not_after_ms=NOW_MS - 1))
    assert h.updates("late") == [("COMMAND_REJECTED", "EXPIRED")] * 2


async def test_min_generation_defers_then_runs_on_the_new_spec(h: Harness) -> None:
    await h.d.on_command(command("c1", "inventory.refresh", min_generation=3))
    assert h.updates("c1") == []
    assert [m.spec_request.reason for m in h.sent if m.WhichOneof("msg") == "spec_request"] == [
        session_pb2.SpecRequest.MIN_GENERATION
    ]
    h.applied = 3
    await h.d.on_spec_applied()
    await h.wait_state("c1", "COMMAND_SUCCEEDED")


async def test_busy_when_the_lane_is_out_of_credit_is_not_journaled(tmp_path: Path) -> None:
    h = Harness(tmp_path)  # workers not started: accepted commands wait, holding their credits
    for i in range(8):
        await h.d.on_command(command(f"c{i}", "inventory.refresh"))
    await h.d.on_command(command("c8", "inventory.refresh"))
    assert h.updates("c8") == [("COMMAND_REJECTED", "BUSY")]
    assert await h.journal.get_command("c8") is None


async def test_a_bad_signature_is_refused_even_without_credit(tmp_path: Path) -> None:
    h = Harness(tmp_path, bad_signature=True)
    await h.d.on_command(command("c1", "inventory.refresh"))
    assert h.updates("c1") == [("COMMAND_REJECTED", "BAD_SIGNATURE")]


async def test_cancel_of_a_queued_command(tmp_path: Path) -> None:
    h = Harness(tmp_path)  # no workers yet: c1 stays queued
    await h.d.on_command(command("c1", "inventory.refresh"))
    await h.d.on_cancel(session_pb2.Cancel(command_id="c1", reason="operator"))
    await h.d.start()
    try:
        await h.wait_state("c1", "COMMAND_CANCELLED")
    finally:
        await h.d.stop()
    assert ("COMMAND_RUNNING", "") not in h.updates("c1")


class AckCountingJournal(MemoryJournal):
    """The memory journal, each `ack_results` call (one transaction on the SQLite journal) recorded."""

    def __init__(self) -> None:
        super().__init__()
        self.ack_writes: list[list[str]] = []

    async def ack_results(self, command_ids: Iterable[str]) -> int:
        ids = list(command_ids)
        self.ack_writes.append(ids)
        return await super().ack_results(ids)


async def _settled(h: Harness, *cids: str) -> None:
    for cid in cids:
        await h.d.on_command(command(cid, "inventory.refresh"))
        await h.wait_state(cid, "COMMAND_SUCCEEDED")


async def test_acks_are_marked_together_within_the_ack_write_delay(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    h.journal = h.d.journal = journal = AckCountingJournal()
    await h.d.start()
    try:
        await _settled(h, "c1", "c2", "c3")
        t0 = h.clock.monotonic()
        await h.d.on_ack(["c1"])
        await h.d.on_ack(["c2", "c1"])  # a repeat is marked once
        assert journal.ack_writes == [] and len(await journal.unacked_results()) == 3
        while not journal.ack_writes:
            await asyncio.sleep(0.1)  # virtual time
        assert h.clock.monotonic() - t0 == pytest.approx(ACK_WRITE_AFTER_S, abs=0.11)
        assert journal.ack_writes == [["c1", "c2"]]
        assert [cid for cid, _ in await journal.unacked_results()] == ["c3"]
    finally:
        await h.d.stop()


async def test_a_hello_and_a_stop_mark_the_waiting_acks_first(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    h.journal = h.d.journal = journal = AckCountingJournal()
    await h.d.start()
    try:
        await _settled(h, "c1", "c2")
        await h.d.on_ack(["c1"])
        await h.d.write_acks()  # what SessionRunner.run does before it reads the Hello's unacked results
        assert journal.ack_writes == [["c1"]]
        assert [cid for cid, _ in await journal.unacked_results()] == ["c2"]
        await h.d.on_ack(["c2"])
    finally:
        await h.d.stop()
    assert journal.ack_writes == [["c1"], ["c2"]] and await journal.unacked_results() == []
