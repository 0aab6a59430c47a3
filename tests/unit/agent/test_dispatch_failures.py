"""A worker never swallows an exception: whatever a kind raises settles its command and frees its lane.

A raising kind is injected on every lane, raising at every step the
dispatcher calls (`parse`, `resources`, `run`), with bad input
(`InvalidPayload`) and with a bug (anything else). Every command must settle
`failed` with the right reason and sentence, journaled, and the lane must go
on: more commands than the lane has credits run after it, and the same
kind, once it stops raising, takes the same lock and succeeds.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from google.protobuf import any_pb2
from google.protobuf.message import Message

from agent.dispatch import Dispatcher
from agent.hw.fake import FakeHardware
from agent.kinds import executor_for
from agent.kinds.base import INTERNAL, INVALID_PAYLOAD, InvalidPayload, KindContext, KindExecutor, KindResult
from agent.memory_journal import MemoryJournal
from bc.protocol import kinds
from bc.protocol.pb import common_pb2, session_pb2
from bc.protocol.pb.session_pb2 import CommandBody, CommandUpdate, NodeMessage
from bc.testing import virtual_clock

NOW_MS = 1_800_000_000_000
LANE_KINDS = {"control": "inventory.refresh", "provision": "diag.dcgm", "bulk": "logs.collect"}
STAGES = ("parse", "resources", "run")


@dataclass
class Raising:
    """A kind that raises `error` at `stage` (None: never), and otherwise succeeds holding one GPU lock."""

    name: str
    stage: str | None
    error: Exception

    def _maybe_raise(self, stage: str) -> None:
        if self.stage == stage:
            raise self.error

    def parse(self, payload: any_pb2.Any) -> Message:
        self._maybe_raise("parse")
        return any_pb2.Any()

    def resources(self, request: Message) -> list[str]:
        self._maybe_raise("resources")
        return ["gpu:GPU-1"]

    async def run(self, ctx: KindContext, request: Message) -> KindResult:
        self._maybe_raise("run")
        return KindResult.success({"ran": True})


class Harness:
    def __init__(self, tmp: Path, kind: KindExecutor) -> None:
        self.sent: list[CommandUpdate] = []
        self.changed = asyncio.Event()
        self.journal = MemoryJournal()
        self.clock = virtual_clock(NOW_MS / 1000)

        async def not_full() -> bool:
            return False

        hw = FakeHardware("hgx-h100-8", "n1", state_dir=tmp)
        self.d = Dispatcher(
            node_id="n1",
            role="node",
            journal=self.journal,
            journal_full=not_full,
            send=self.send,
            ctx=KindContext(node_id="n1", data_dir=tmp, hw=hw, cdi_dir=tmp / "cdi", boot_id="boot-1"),
            clock=self.clock,
            incarnation_id="inc-1",
            boot_id="boot-1",
            applied_generation=lambda: 1,
            server_now_ms=lambda: int(self.clock.now() * 1000),
            executors=lambda name: kind if name == kind.name else executor_for(name),
        )

    async def send(self, msg: NodeMessage) -> None:
        if msg.WhichOneof("msg") == "command_update":
            self.sent.append(msg.command_update)
            self.changed.set()

    async def settle(self, cid: str, kind: str) -> CommandUpdate:
        """Deliver a command and wait for its terminal update (5 s: a swallowed exception never gets one)."""
        body = CommandBody(id=cid, node_id="n1", kind=kind, not_after_ms=NOW_MS + 60_000)
        await self.d.on_command(
            session_pb2.Command(envelope=common_pb2.Envelope(purpose="command", body=body.SerializeToString()))
        )
        terminal = (session_pb2.COMMAND_SUCCEEDED, session_pb2.COMMAND_FAILED, session_pb2.COMMAND_REJECTED)

        async def until() -> CommandUpdate:
            while True:
                for u in self.sent:
                    if u.command_id == cid and u.state in terminal:
                        return u
                self.changed.clear()
                await self.changed.wait()

        return await asyncio.wait_for(until(), 5)


@pytest.fixture(params=sorted(LANE_KINDS))
def lane(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@asynccontextmanager
async def started(h: Harness) -> AsyncIterator[Harness]:
    await h.d.start()
    try:
        yield h
    finally:
        await h.d.stop()


@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.parametrize(
    ("error", "reason", "sentence"),
    [
        (ValueError("Invalid IPv6 URL"), INTERNAL, "ValueError: Invalid IPv6 URL"),
        (KeyError("gpu_uuids"), INTERNAL, "KeyError: 'gpu_uuids'"),
        (InvalidPayload("upload_url is not a URL"), INVALID_PAYLOAD, "upload_url is not a URL"),
    ],
)
async def test_a_raising_kind_settles_failed_and_frees_its_lane(
    tmp_path: Path, lane: str, stage: str, error: Exception, reason: str, sentence: str
) -> None:
    name = LANE_KINDS[lane]
    assert kinds.KINDS[name].lane == lane
    raising = Raising(name, stage, error)
    async with started(Harness(tmp_path, raising)) as h:
        # More commands than the lane has credits, one after another: a leaked credit or a dead worker stalls one.
        for i in range(kinds.GATEWAY_CREDITS[lane] + 1):
            update = await h.settle(f"c{i}", name)
            assert (session_pb2.CommandState.Name(update.state), update.reason, update.message) == (
                "COMMAND_FAILED",
                reason,
                sentence,
            )
            entry = await h.journal.get_command(f"c{i}")
            assert entry is not None and entry.state == "done"  # journaled: a redelivery resends it
        assert h.d.active == {} and h.d.lanes[lane].in_use == 0

        raising.stage = None  # the same kind, no longer raising, takes the same lock and runs
        ok = await h.settle("after", name)
        assert session_pb2.CommandState.Name(ok.state) == "COMMAND_SUCCEEDED", ok


async def test_a_journal_that_fails_to_record_the_result_still_settles_and_the_lane_goes_on(
    tmp_path: Path, lane: str
) -> None:
    name = LANE_KINDS[lane]
    async with started(Harness(tmp_path, Raising(name, None, ValueError()))) as h:
        real_finish = h.journal.finish
        failures = iter([OSError(28, "No space left on device"), OSError(28, "No space left on device")])

        async def finish(command_id: str, update: bytes, now: float) -> bool:
            error = next(failures, None)
            if error is not None:
                raise error
            return await real_finish(command_id, update, now)

        h.journal.finish = finish  # type: ignore[method-assign]
        update = await h.settle("c1", name)
        # Neither the result nor the internal failure could be journaled: it is reported all the same.
        assert (session_pb2.CommandState.Name(update.state), update.reason) == ("COMMAND_FAILED", INTERNAL)
        assert "No space left on device" in update.message
        ok = await h.settle("c2", name)
        assert session_pb2.CommandState.Name(ok.state) == "COMMAND_SUCCEEDED", ok
        assert h.d.lanes[lane].in_use == 0


async def test_a_failed_running_mark_of_a_self_terminating_kind_settles_internal(tmp_path: Path) -> None:
    name = "node.reboot"
    assert kinds.KINDS[name].self_terminating
    async with started(Harness(tmp_path, Raising(name, None, ValueError()))) as h:

        async def mark_running(command_id: str, incarnation_id: str, boot_id: str, now: float) -> None:
            raise OSError(5, "Input/output error")

        h.journal.mark_running = mark_running  # type: ignore[method-assign]
        update = await h.settle("c1", name)
        assert (session_pb2.CommandState.Name(update.state), update.reason) == ("COMMAND_FAILED", INTERNAL)
        assert update.message == "OSError: [Errno 5] Input/output error"
        entry = await h.journal.get_command("c1")
        assert entry is not None and entry.state == "done"
