"""A model agent over `MemoryJournal`, driven by random interleavings of deliveries, crashes and reboots.

The agent follows the reference: every delivery goes through `resolve`, every
process start through `recover`; `accepted` is journaled before the side
effect may start, and a self-terminating kind journals `running{boot_id}`
right before its side effect. The world records every side-effect start and
every terminal update the server receives, and the test checks the promises
the journal exists for:

* a command that is not retry-safe starts its side effect at most once, ever;
* a retry-safe one starts again only in a later process, after a crash or
  reboot interrupted it before it settled;
* a self-terminating command whose `running` entry survives into a new boot
  is reported `rebooted` and never runs again;
* every terminal update sent for a command (a resend, a Hello replay) carries
  the same bytes as the first;
* after a restart, nothing that needs no server input is left unsettled.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Literal

from hypothesis import given, settings
from hypothesis import strategies as st

from agent.journal_rules import Acceptance, CommandEntry, Resolution, recover, resolve
from agent.memory_journal import MemoryJournal
from bc.protocol.pb import session_pb2

TERMINAL = {
    session_pb2.COMMAND_SUCCEEDED,
    session_pb2.COMMAND_FAILED,
    session_pb2.COMMAND_REJECTED,
    session_pb2.COMMAND_CANCELLED,
}


@dataclass(frozen=True)
class Kind:
    retry_safe: bool
    self_terminating: bool


@dataclass(frozen=True)
class Deliver:
    index: int
    checks_pass: bool  # the acceptance checks (not_after, min_generation, ...) as they stand at this delivery


# Start, Finish and Cancel pick among the commands in flight that they apply to (index modulo their number),
# so a random sequence seldom wastes a step on a command that is not there.


@dataclass(frozen=True)
class Start:
    index: int


@dataclass(frozen=True)
class Finish:
    index: int


@dataclass(frozen=True)
class Cancel:
    index: int


@dataclass(frozen=True)
class Crash:
    pass


@dataclass(frozen=True)
class Reboot:
    pass


@dataclass(frozen=True)
class AckAll:
    pass


Op = Deliver | Start | Finish | Cancel | Crash | Reboot | AckAll


@dataclass
class World:
    """What the outside sees: side effects and what reached the server."""

    starts: dict[str, list[tuple[str, str]]] = field(default_factory=dict)  # (incarnation, boot) per start
    terminal: dict[str, bytes] = field(default_factory=dict)  # the first terminal update per command
    terminal_sends: int = 0
    rebooted: set[str] = field(default_factory=set)  # running self-terminating entries a reboot completed

    def receive(self, cid: str, update: bytes) -> None:
        u = session_pb2.CommandUpdate.FromString(update)
        assert u.command_id == cid
        if u.state not in TERMINAL:
            return
        if u.reason == "rebooted":
            assert cid in self.rebooted, f"{cid}: reported rebooted, but no reboot followed its running entry"
        self.terminal_sends += 1
        first = self.terminal.setdefault(cid, update)
        assert update == first, f"{cid}: a second, different terminal result"


@dataclass
class ModelAgent:
    journal: MemoryJournal
    world: World
    kinds: dict[str, Kind]
    incarnation: int = 0
    boot: int = 0
    now: float = 0.0
    in_flight: dict[str, Literal["accepted", "started"]] = field(default_factory=dict)

    @property
    def inc(self) -> str:
        return f"inc-{self.incarnation}"

    @property
    def boot_id(self) -> str:
        return f"boot-{self.boot}"

    def tick(self) -> float:
        self.now += 1.0
        return self.now

    def update(self, cid: str, state: session_pb2.CommandState, reason: str = "", result: bytes = b"") -> bytes:
        return session_pb2.CommandUpdate(
            command_id=cid, state=state, reason=reason, result=result, boot_id=self.boot_id
        ).SerializeToString(deterministic=True)

    # -- a process start: recover, then replay unacked results in Hello -
    async def start_process(self) -> None:
        settlements = recover(await self.journal.commands(), self.inc, self.boot_id)
        updates = {
            s.command_id: (
                self.update(s.command_id, session_pb2.COMMAND_SUCCEEDED, "rebooted", s.previous_boot_id.encode())
                if s.outcome == "rebooted"
                else self.update(s.command_id, session_pb2.COMMAND_FAILED, "interrupted")
            )
            for s in settlements
        }
        await self.journal.apply_settlements(settlements, updates, self.tick())
        for cid, update in await self.journal.unacked_results():
            self.world.receive(cid, update)
        for e in await self.journal.commands():
            # nothing that needs no server input is left: only retry-safe entries wait for redelivery
            assert e.state == "done" or e.retry_safe, e
            assert resolve(e, self.inc, self.boot_id) in (Resolution.RESEND, Resolution.REEXECUTE)

    async def crash(self) -> None:
        self.in_flight.clear()
        self.incarnation += 1
        await self.start_process()

    async def reboot(self) -> None:
        for e in await self.journal.commands():
            if e.state == "running" and e.self_terminating and e.boot_id == self.boot_id:
                self.world.rebooted.add(e.command_id)
        self.in_flight.clear()
        self.incarnation += 1
        self.boot += 1
        await self.start_process()
        for cid in self.world.rebooted:
            u = session_pb2.CommandUpdate.FromString(self.world.terminal[cid])
            assert (u.state, u.reason) == (session_pb2.COMMAND_SUCCEEDED, "rebooted")

    # -- a delivery -----------------------------------------------------
    async def deliver(self, cid: str, checks_pass: bool) -> None:
        entry = await self.journal.get_command(cid)
        r = resolve(entry, self.inc, self.boot_id)
        if r in (Resolution.EXECUTE, Resolution.REEXECUTE):
            kind = self.kinds[cid]
            if not checks_pass:
                update = self.update(cid, session_pb2.COMMAND_REJECTED, "EXPIRED")
                assert await self.journal.record_done(cid, "k", update, self.inc, self.boot_id, self.tick())
                self.world.receive(cid, update)
                return
            await self.journal.accept(
                Acceptance(
                    cid, "k", kind.retry_safe, kind.self_terminating, self.inc, self.boot_id, b"body", self.tick()
                )
            )
            self.in_flight[cid] = "accepted"
            self.world.receive(cid, self.update(cid, session_pb2.COMMAND_ACKED))
        elif r is Resolution.RESEND:
            assert entry is not None and entry.result is not None
            self.world.receive(cid, entry.result)
        elif r is Resolution.REATTACH:
            assert cid in self.in_flight, "an entry of this process is in flight in it"
        else:
            raise AssertionError(f"{cid}: {r} at delivery; recover settles these at start")

    # -- the execution ------------------------------------------------
    def pick(self, phase: Literal["accepted", "started"], index: int) -> str:
        found = sorted(cid for cid, p in self.in_flight.items() if p == phase)
        return found[index % len(found)] if found else ""

    async def start(self, cid: str) -> None:
        if self.in_flight.get(cid) != "accepted":
            return
        entry = await self.journal.get_command(cid)
        assert entry is not None and entry.state == "accepted" and entry.incarnation_id == self.inc, (
            "accepted is durable before the side effect"
        )
        kind = self.kinds[cid]
        if kind.self_terminating:
            await self.journal.mark_running(cid, self.inc, self.boot_id, self.tick())
        self.check_may_start(cid, kind)
        self.world.starts.setdefault(cid, []).append((self.inc, self.boot_id))
        self.in_flight[cid] = "started"

    def check_may_start(self, cid: str, kind: Kind) -> None:
        earlier = self.world.starts.get(cid, [])
        assert cid not in self.world.rebooted, f"{cid}: completed by its reboot, run again"
        assert cid not in self.world.terminal, f"{cid}: settled, run again"
        if not kind.retry_safe:
            assert not earlier, f"{cid}: not retry-safe, started twice"
        for inc, _ in earlier:
            assert inc != self.inc, f"{cid}: re-executed without a crash"

    async def finish(self, cid: str) -> None:
        if self.in_flight.get(cid) != "started":
            return
        update = self.update(cid, session_pb2.COMMAND_SUCCEEDED, result=f"{cid} ran in {self.inc}".encode())
        assert await self.journal.finish(cid, update, self.tick())
        del self.in_flight[cid]
        self.world.receive(cid, update)

    async def cancel(self, cid: str) -> None:
        """A queued command is cancelled; one whose side effect started reports its real outcome."""
        if self.in_flight.get(cid) != "accepted":
            return
        update = self.update(cid, session_pb2.COMMAND_CANCELLED, "cancelled")
        assert await self.journal.finish(cid, update, self.tick())
        del self.in_flight[cid]
        self.world.receive(cid, update)

    async def ack_all(self) -> None:
        await self.journal.ack_results(list(self.world.terminal))


async def run(kinds: list[Kind], ops: list[Op]) -> tuple[World, list[CommandEntry]]:
    world = World()
    agent = ModelAgent(MemoryJournal(), world, {f"c{i}": k for i, k in enumerate(kinds)})
    await agent.start_process()
    for op in ops:
        match op:
            case Deliver(i, ok):
                await agent.deliver(f"c{i}", ok)
            case Start(i):
                await agent.start(agent.pick("accepted", i))
            case Finish(i):
                await agent.finish(agent.pick("started", i))
            case Cancel(i):
                await agent.cancel(agent.pick("accepted", i))
            case Crash():
                await agent.crash()
            case Reboot():
                await agent.reboot()
            case AckAll():
                await agent.ack_all()
    await agent.crash()  # a last restart settles what needs no server input
    return world, await agent.journal.commands()


N = 4
kinds_st = st.lists(st.builds(Kind, st.booleans(), st.booleans()), min_size=N, max_size=N)
index_st = st.integers(0, N - 1)
deliver_st = st.builds(Deliver, index_st, st.sampled_from([True, True, True, False]))  # checks mostly pass
step_st = st.integers(0, N - 1)
# Progress (deliver, start, finish) is drawn more often than loss (crash, reboot), so commands get somewhere.
ops_st = st.lists(
    st.one_of(
        deliver_st,
        deliver_st,
        st.builds(Start, step_st),
        st.builds(Start, step_st),
        st.builds(Finish, step_st),
        st.sampled_from([Cancel(0), Crash(), Reboot(), AckAll()]),
    ),
    min_size=20,
    max_size=80,
)


@settings(max_examples=400, deadline=None)
@given(kinds_st, ops_st)
def test_the_journal_rules_keep_their_promises_across_crashes_and_reboots(kinds: list[Kind], ops: list[Op]) -> None:
    world, entries = asyncio.run(run(kinds, ops))
    by_id = {e.command_id: e for e in entries}
    for i, kind in enumerate(kinds):
        cid = f"c{i}"
        starts = world.starts.get(cid, [])
        if not kind.retry_safe:
            assert len(starts) <= 1
            if starts:
                assert by_id[cid].state == "done", "a started non-retry-safe command always settles"
        if cid in by_id and by_id[cid].state == "done":
            assert by_id[cid].result == world.terminal[cid]


def test_a_reboot_completes_a_running_self_terminating_command() -> None:
    kinds = [Kind(retry_safe=True, self_terminating=True)]
    world, entries = asyncio.run(run(kinds, [Deliver(0, True), Start(0), Reboot(), Deliver(0, True)]))
    assert [(e.state, e.boot_id) for e in entries] == [("done", "boot-0")], "settled, still naming its boot"
    assert world.rebooted == {"c0"}
    assert len(world.starts["c0"]) == 1
    u = session_pb2.CommandUpdate.FromString(world.terminal["c0"])
    assert (u.state, u.reason, u.result, u.boot_id) == (session_pb2.COMMAND_SUCCEEDED, "rebooted", b"boot-0", "boot-1")
    assert world.terminal_sends == 3, "two Hello replays (after the reboot, after the last restart) and a resend"


def test_a_crash_before_the_reboot_reruns_a_retry_safe_self_terminating_command() -> None:
    kinds = [Kind(retry_safe=True, self_terminating=True)]
    world, _ = asyncio.run(run(kinds, [Deliver(0, True), Start(0), Crash(), Deliver(0, True), Start(0), Finish(0)]))
    assert [s[0] for s in world.starts["c0"]] == ["inc-0", "inc-1"]
    assert world.rebooted == set()


def test_a_crash_interrupts_a_command_that_is_not_retry_safe() -> None:
    kinds = [Kind(retry_safe=False, self_terminating=False)]
    world, entries = asyncio.run(run(kinds, [Deliver(0, True), Start(0), Crash(), Deliver(0, True), Start(0)]))
    assert len(world.starts["c0"]) == 1
    u = session_pb2.CommandUpdate.FromString(world.terminal["c0"])
    assert (u.state, u.reason) == (session_pb2.COMMAND_FAILED, "interrupted")
    assert [e.state for e in entries] == ["done"]


def test_a_journaled_rejection_answers_every_duplicate_the_same() -> None:
    kinds = [Kind(retry_safe=True, self_terminating=False)]
    world, _ = asyncio.run(run(kinds, [Deliver(0, False), Deliver(0, True), Crash(), Deliver(0, True)]))
    assert "c0" not in world.starts
    assert session_pb2.CommandUpdate.FromString(world.terminal["c0"]).state == session_pb2.COMMAND_REJECTED
