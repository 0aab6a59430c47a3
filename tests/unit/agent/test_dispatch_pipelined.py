"""Pipelined accepts (issue 19): the session hands a command on once it is decided, and its `accepted` write
is awaited by a task of its own, so accepts that arrive while one commits share the next commit.

On a real journal file whose COMMITs the test holds and releases (`HeldCommits`, through `Journal.open`'s
`connect` seam): accepts of different lanes land in one commit; no side effect starts and no ACKED goes
out before the command's own `accepted` is on the disk (read by another connection); a batch whose commit
fails fails every member: none runs, none is answered, each frees its credit, the session hears of it,
and a redelivery then runs; a duplicate or a cancel of a command whose accept is being written is answered
from the journal once it is written; and a lane's commands start in the order they were accepted even when
their writes end in another order.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator, Iterable, Sequence
from pathlib import Path
from typing import Any, cast

import aiosqlite
import pytest
from google.protobuf import any_pb2
from google.protobuf.message import Message

from agent.dispatch import Dispatcher
from agent.hw.fake import FakeHardware
from agent.journal import Journal
from agent.journal_api import AgentJournal
from agent.journal_conn import connect_commit_in_thread
from agent.journal_rules import RESULT, Acceptance
from agent.kinds import executor_for
from agent.kinds.base import KindContext, KindExecutor, KindResult
from agent.memory_journal import MemoryJournal
from bc.protocol import kinds
from bc.protocol.pb import common_pb2, session_pb2
from bc.protocol.pb.session_pb2 import CommandBody, NodeMessage
from bc.testing import virtual_clock

pytestmark = pytest.mark.wall_clock  # the journal's thread answers where a virtual loop cannot see it (tests/loops.py)

NOW_MS = 1_800_000_000_000
LANE_KINDS = {"control": "inventory.refresh", "provision": "diag.dcgm", "bulk": "logs.collect"}


class HeldCommits:
    """The agent's journal connection, each COMMIT first waiting for `open` (set: commits go through); the
    n-th COMMIT fails with `fails[n]` if it names one (it never reaches SQLite, and the journal rolls the
    transaction back)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.open = asyncio.Event()
        self.open.set()
        self.arrived = 0  # COMMITs issued, held or not
        self.committed = 0
        self.fails: dict[int, Exception] = {}

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        if sql == "COMMIT":
            return self._commit()
        return self.inner.execute(sql, params)

    def executemany(self, sql: str, params: Iterable[Sequence[Any]]) -> Any:
        return self.inner.executemany(sql, params)

    @property
    def in_transaction(self) -> bool:
        return bool(self.inner.in_transaction)

    async def close(self) -> None:
        await self.inner.close()

    async def _commit(self) -> Any:
        self.arrived += 1
        n = self.arrived
        await self.open.wait()
        if n in self.fails:
            raise self.fails[n]
        cur = await self.inner.execute("COMMIT")
        self.committed += 1
        return cur

    async def until_held(self, n: int) -> None:
        """Until `n` COMMITs have been issued (the last of them waiting while `open` is clear)."""
        for _ in range(1000):
            if self.arrived >= n:
                return
            await asyncio.sleep(0)
        raise AssertionError(f"{self.arrived} commits issued, not {n}")


def durable(path: Path) -> dict[str, str]:
    """What another connection reads from the file: command id to state."""
    conn = sqlite3.connect(path)
    try:
        return {str(r[0]): str(r[1]) for r in conn.execute("SELECT command_id, state FROM commands")}
    finally:
        conn.close()


class Recording:
    """A kind that records each start (with what the journal file holds for it then) and waits for `go`."""

    def __init__(self, name: str, journal_path: Path | None, starts: list[tuple[str, str | None]]) -> None:
        self.name, self.path, self.starts = name, journal_path, starts
        self.go = asyncio.Event()
        self.go.set()

    def parse(self, payload: any_pb2.Any) -> Message:
        return any_pb2.Any()

    def resources(self, request: Message) -> list[str]:
        return []

    async def run(self, ctx: KindContext, request: Message) -> KindResult:
        assert ctx.command_id is not None
        self.starts.append((ctx.command_id, durable(self.path).get(ctx.command_id) if self.path else None))
        await self.go.wait()
        return KindResult.success({"ran": ctx.command_id})


class Harness:
    def __init__(self, tmp: Path, journal: AgentJournal, path: Path | None) -> None:
        self.journal, self.path = journal, path
        self.sent: list[session_pb2.CommandUpdate] = []
        self.acked_durable: dict[str, str | None] = {}  # what the file held for a command when its ACKED left
        self.changed = asyncio.Event()
        self.starts: list[tuple[str, str | None]] = []
        self.kinds = {name: Recording(name, path, self.starts) for name in LANE_KINDS.values()}
        self.clock = virtual_clock(NOW_MS / 1000)
        hw = FakeHardware("hgx-h100-8", "n1", state_dir=tmp)
        self.d = Dispatcher(
            node_id="n1",
            role="node",
            journal=journal,
            journal_full=journal.is_full,
            send=self.send,
            ctx=KindContext(node_id="n1", data_dir=tmp, hw=hw, cdi_dir=tmp / "cdi", boot_id="boot-1"),
            clock=self.clock,
            incarnation_id="inc-1",
            boot_id="boot-1",
            applied_generation=lambda: 1,
            server_now_ms=lambda: int(self.clock.now() * 1000),
            executors=self.executor,
        )

    def executor(self, name: str) -> KindExecutor | None:
        return cast(KindExecutor, self.kinds[name]) if name in self.kinds else executor_for(name)

    async def send(self, msg: NodeMessage) -> None:
        if msg.WhichOneof("msg") != "command_update":
            return
        u = msg.command_update
        if u.state == session_pb2.COMMAND_ACKED and self.path is not None:
            self.acked_durable[u.command_id] = durable(self.path).get(u.command_id)
        self.sent.append(u)
        self.changed.set()

    def states(self, cid: str) -> list[str]:
        return [session_pb2.CommandState.Name(u.state) for u in self.sent if u.command_id == cid]

    async def deliver(self, cid: str, lane: str = "control") -> None:
        """Deliver as the session does; it must return while the command's accept may still be written."""
        body = CommandBody(id=cid, node_id="n1", kind=LANE_KINDS[lane], not_after_ms=NOW_MS + 60_000)
        cmd = session_pb2.Command(envelope=common_pb2.Envelope(purpose="command", body=body.SerializeToString()))
        await asyncio.wait_for(self.d.on_command(cmd), 5)

    async def wait_state(self, cid: str, state: str) -> None:
        async def until() -> None:
            while state not in self.states(cid):
                self.changed.clear()
                await self.changed.wait()

        await asyncio.wait_for(until(), 5)


@pytest.fixture
async def held(tmp_path: Path) -> AsyncIterator[tuple[Harness, HeldCommits]]:
    conns: list[HeldCommits] = []

    async def connect(path: str) -> aiosqlite.Connection:
        conns.append(HeldCommits(await connect_commit_in_thread(path)))
        return cast(aiosqlite.Connection, conns[-1])

    path = tmp_path / "journal.db"
    journal = await Journal.open(path, "n1", connect=connect)
    conns[0].arrived = conns[0].committed = 0  # count from here: opening committed the schema
    h = Harness(tmp_path, journal, path)
    try:
        yield h, conns[0]
    finally:
        conns[0].open.set()
        for k in h.kinds.values():
            k.go.set()
        await h.d.stop()
        await journal.close()


async def started(h: Harness, conn: HeldCommits) -> None:
    """The workers started; commits counted from here (start sweeps the journal in a transaction)."""
    await h.d.start()
    conn.arrived = conn.committed = 0


async def turns(n: int = 50) -> None:
    """Let every task that can run, run (the journal's thread answers within these turns or not at all)."""
    for _ in range(n):
        await asyncio.sleep(0)


async def test_accepts_of_every_lane_that_arrive_while_one_commits_share_the_next_commit(
    held: tuple[Harness, HeldCommits],
) -> None:
    h, conn = held
    journal = cast(Journal, h.journal)
    conn.open.clear()
    await h.deliver("first", "control")
    await conn.until_held(1)  # `first`'s accept commits alone, and is held there
    for cid, lane in (("c", "control"), ("p", "provision"), ("b", "bulk")):
        await h.deliver(cid, lane)  # each returns at once: the session reads on while `first` commits
    await turns()
    assert conn.arrived == 1, "a later accept did not wait for the commit in flight"
    assert h.sent == [] and durable(journal.path) == {}
    assert [lane.in_use for lane in h.d.lanes.values()] == [2, 1, 1]  # credits are taken at acceptance

    conn.open.set()
    for cid in ("first", "c", "p", "b"):
        await h.wait_state(cid, "COMMAND_ACKED")
    assert conn.committed == 2, "the three accepts did not share one commit"
    stats = journal.batches.stats
    assert (stats.transactions, stats.members, stats.split, stats.failed) == (1, 3, 0, 0)
    assert h.acked_durable == dict.fromkeys(("first", "c", "p", "b"), "accepted")


async def test_no_side_effect_starts_and_no_acked_is_sent_before_the_commands_accept_is_durable(
    held: tuple[Harness, HeldCommits],
) -> None:
    h, conn = held
    await started(h, conn)
    conn.open.clear()
    for cid, lane in (("c1", "control"), ("p1", "provision"), ("c2", "control"), ("b1", "bulk")):
        await h.deliver(cid, lane)
    await conn.until_held(1)
    await turns()
    assert h.starts == [] and h.sent == []
    assert all(lane.queue.empty() for lane in h.d.lanes.values())
    assert await h.d.running_ids() == [], "a Hello would name commands whose accept is not durable"

    conn.open.set()
    for cid in ("c1", "p1", "c2", "b1"):
        await h.wait_state(cid, "COMMAND_SUCCEEDED")
        assert h.states(cid) == ["COMMAND_ACKED", "COMMAND_RUNNING", "COMMAND_SUCCEEDED"]
    assert sorted(h.starts) == sorted((cid, "accepted") for cid in ("c1", "p1", "c2", "b1"))
    assert h.acked_durable == dict.fromkeys(("c1", "p1", "c2", "b1"), "accepted")


async def test_a_batch_whose_commit_fails_runs_and_answers_none_of_its_members(
    held: tuple[Harness, HeldCommits],
) -> None:
    h, conn = held
    journal = cast(Journal, h.journal)
    await started(h, conn)
    failure = asyncio.create_task(h.d.accept_failed())  # what the session waits on
    h.kinds["inventory.refresh"].go.clear()  # `lead` runs and stays running: its `done` stays out of the way
    conn.open.clear()
    await h.deliver("lead", "control")
    await conn.until_held(1)
    for cid, lane in (("c", "control"), ("p", "provision"), ("b", "bulk")):
        await h.deliver(cid, lane)
    conn.fails[2] = OSError(5, "Input/output error")  # the commit of the three, after `lead`'s own
    conn.open.set()

    error = await asyncio.wait_for(failure, 5)
    await h.wait_state("lead", "COMMAND_RUNNING")
    assert isinstance(error, OSError) and error.errno == 5
    await turns()
    assert journal.batches.stats.failed == 1
    assert durable(journal.path) == {"lead": "accepted"}
    for cid in ("c", "p", "b"):
        assert h.states(cid) == [], f"{cid} was answered though its accept failed"
    assert [cid for cid, _ in h.starts] == ["lead"], "a member of the failed batch ran"
    assert [lane.in_use for lane in h.d.lanes.values()] == [1, 0, 0], "a failed accept kept its credit"
    assert sorted(h.d.active) == ["lead"]

    h.kinds["inventory.refresh"].go.set()
    for cid, lane in (("c", "control"), ("p", "provision"), ("b", "bulk")):  # the next session's redelivery
        await h.deliver(cid, lane)
    for cid in ("lead", "c", "p", "b"):
        await h.wait_state(cid, "COMMAND_SUCCEEDED")
    assert sorted(cid for cid, _ in h.starts) == ["b", "c", "lead", "p"]


async def test_a_duplicate_and_a_cancel_of_a_command_whose_accept_is_being_written(
    held: tuple[Harness, HeldCommits],
) -> None:
    h, conn = held
    await started(h, conn)
    conn.open.clear()
    await h.deliver("dup", "control")
    await conn.until_held(1)
    await h.deliver("dup", "control")  # a duplicate frame: the journal cannot tell yet
    await h.deliver("gone", "provision")
    await h.d.on_cancel(session_pb2.Cancel(command_id="gone", reason="operator"))
    await turns()
    assert h.sent == []
    conn.open.set()
    await h.wait_state("dup", "COMMAND_SUCCEEDED")
    await h.wait_state("gone", "COMMAND_CANCELLED")
    await turns()
    dup = h.states("dup")
    # ACKED once durable, then RUNNING and SUCCEEDED, and one answer more: the duplicate's, from the journal.
    assert dup[0] == "COMMAND_ACKED" and len(dup) == 4, dup
    assert set(dup) <= {"COMMAND_ACKED", "COMMAND_RUNNING", "COMMAND_SUCCEEDED"}
    assert [cid for cid, _ in h.starts] == ["dup"], "a duplicate ran twice, or a cancelled command ran"
    assert "COMMAND_RUNNING" not in h.states("gone")


class GatedAccepts(MemoryJournal):
    """The memory journal, an accept of a command named in `gates` waiting for its event (and failing
    with `fails`'s error if it names one), so the accepts of one lane can end out of order."""

    def __init__(self) -> None:
        super().__init__()
        self.gates: dict[str, asyncio.Event] = {}
        self.fails: dict[str, Exception] = {}

    async def accept(self, a: Acceptance) -> None:
        gate = self.gates.get(a.command_id)
        if gate is not None:
            await gate.wait()
        if a.command_id in self.fails:
            raise self.fails[a.command_id]
        await super().accept(a)


@pytest.mark.parametrize("first_fails", [False, True])
async def test_a_lanes_commands_start_in_the_order_they_were_accepted(tmp_path: Path, first_fails: bool) -> None:
    journal = GatedAccepts()
    h = Harness(tmp_path, journal, None)
    await h.d.start()
    try:
        journal.gates["c1"] = gate = asyncio.Event()
        if first_fails:
            journal.fails["c1"] = OSError(28, "No space left on device")
        for cid in ("c1", "c2", "c3"):
            await h.deliver(cid, "control")
        await h.deliver("p1", "provision")
        await h.wait_state("p1", "COMMAND_SUCCEEDED")  # another lane does not wait for c1
        await h.wait_state("c3", "COMMAND_ACKED")  # c2 and c3 are durable, behind c1 in their lane
        await turns()
        assert [cid for cid, _ in h.starts] == ["p1"], "a lane's later command started before an earlier one"
        gate.set()
        for cid in ("c2", "c3"):
            await h.wait_state(cid, "COMMAND_SUCCEEDED")
        if first_fails:
            assert h.states("c1") == []
            assert [cid for cid, _ in h.starts] == ["p1", "c2", "c3"]
        else:
            await h.wait_state("c1", "COMMAND_SUCCEEDED")
            assert [cid for cid, _ in h.starts] == ["p1", "c1", "c2", "c3"]
        assert all(lane.in_use == 0 for lane in h.d.lanes.values())
    finally:
        await h.d.stop()


def test_the_lane_kinds_are_on_their_lanes() -> None:
    assert {lane: getattr(kinds.get(k), "lane", None) for lane, k in LANE_KINDS.items()} == {
        lane: lane for lane in LANE_KINDS
    }


async def test_the_reads_of_a_new_command_do_not_wait_for_a_commit_in_flight(
    held: tuple[Harness, HeldCommits],
) -> None:
    h, conn = held
    journal = cast(Journal, h.journal)
    assert await journal.get_command("nobody") is None and not await journal.is_full()  # both read once
    conn.open.clear()
    accepting = asyncio.create_task(
        journal.accept(Acceptance("being-written", "inventory.refresh", True, False, "inc-1", "boot-1", b"body", 1.0))
    )
    await conn.until_held(1)
    # The session's two reads for a new command answer while the accept in flight holds the journal's lock.
    assert await asyncio.wait_for(journal.get_command("new"), 1) is None
    assert await asyncio.wait_for(journal.is_full(), 1) is False
    # A command the journal may hold is read under the lock, so its answer waits for the commit.
    read = asyncio.create_task(journal.get_command("being-written"))
    await turns()
    assert not read.done()
    conn.open.set()
    await accepting
    entry = await read
    assert entry is not None and entry.state == "accepted"
    # An event write makes is_full read again: filled to its bound with results, the journal says full.
    journal.max_events = 2
    await journal.append_events([("result", RESULT, b"r1"), ("result", RESULT, b"r2")])
    assert await journal.is_full()
    await journal.ack_events(2)
    assert not await journal.is_full()
    await journal.delete_commands(["being-written"])
    assert await journal.get_command("being-written") is None
