"""The whole agent through an injected `dial()` over in-memory links, against a tiny scripted gateway.

Every part comes in through `AgentParts`: the virtual loop's clock, a Random from the seed, the memory
journal, fake GPUs, inline offload, and `dial()` over `bc.seams.network.link_pair`. The scenarios run on the
virtual-time loop, on a loop that refuses to hand anything to a thread: an agent so built never does.
What is asserted is what the gateway sees on the wire, and what the agent keeps (identity.json's
`revoked`, its journal).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
from collections.abc import Callable, Coroutine
from concurrent.futures import Executor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from google.protobuf import any_pb2

from agent.app import Agent, AgentOptions, AgentParts
from agent.hw.fake import FakeHardware
from agent.identity import HeldIdentity, Identity
from agent.journal_api import new_journal_id
from agent.journal_rules import Acceptance
from agent.memory_journal import MemoryJournal
from agent.node_key import NodeKey
from agent.offload import inline
from bc.pki import keys
from bc.protocol import closing
from bc.protocol.pb import common_pb2, kinds_pb2, session_pb2, spec_pb2
from bc.protocol.pb.session_pb2 import CloseReason, GatewayMessage, NodeMessage
from bc.seams.link import Link, LinkClosed
from bc.seams.network import SimLink, link_pair
from bc.seams.virtual_time import VirtualTimeLoop, virtual_clock

T = TypeVar("T")
NODE = "n1"


class NoThreadLoop(VirtualTimeLoop):
    """The virtual loop, refusing executor jobs: anything the agent hands to a thread fails the test."""

    def run_in_executor(self, executor: Executor | None, func: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        raise AssertionError(f"the agent handed {func!r} to a thread")


def run(coro: Coroutine[Any, Any, T]) -> T:
    before = set(threading.enumerate())
    with asyncio.Runner(loop_factory=NoThreadLoop) as runner:
        out = runner.run(coro)
    # New threads only: one an earlier test in this worker left may end meanwhile (CI saw 2 → 1).
    started = [t.name for t in set(threading.enumerate()) - before]
    assert not started, f"the agent started a thread: {started}"
    return out


@dataclass
class Gateway:
    """The gateway's end of every dial, in order; the test script answers on it."""

    links: asyncio.Queue[SimLink[NodeMessage, GatewayMessage]] = field(default_factory=asyncio.Queue)
    dialed_at: list[float] = field(default_factory=list)

    async def dial(self) -> Link[GatewayMessage, NodeMessage]:
        node_end, gateway_end = link_pair(NODE)
        self.dialed_at.append(asyncio.get_running_loop().time())
        await self.links.put(gateway_end)
        return node_end

    async def accept(self) -> SimLink[NodeMessage, GatewayMessage]:
        return await asyncio.wait_for(self.links.get(), 3600)

    def delays(self) -> list[float]:
        return [b - a for a, b in zip(self.dialed_at, self.dialed_at[1:], strict=False)]


def build(
    tmp: Path, seed: int, gateway: Gateway, journal: Callable[[random.Random], MemoryJournal] | None = None
) -> tuple[Agent, HeldIdentity]:
    rng = random.Random(seed)
    held = HeldIdentity()
    parts = AgentParts(
        clock=virtual_clock(),
        rng=rng,
        identity=Identity(node_id=NODE, role="node", server="memory", identity_generation=1, ca_fingerprint=""),
        ca_pem=b"",
        identity_store=held,
        node_key=NodeKey(None, keys.generate_key()),
        hw=FakeHardware("hgx-h100-8", NODE, state_dir=tmp, rng=rng, offload=inline),
        dial=gateway.dial,
        open_journal=lambda: _journal(rng, journal),
        offload=inline,
        renewal=False,
    )
    return Agent(AgentOptions(data_dir=tmp), parts), held


async def _journal(rng: random.Random, make: Callable[[random.Random], MemoryJournal] | None) -> MemoryJournal:
    return make(rng) if make is not None else MemoryJournal(new_journal_id(rng))


async def expect(
    link: SimLink[NodeMessage, GatewayMessage], kind: str, pred: Callable[[NodeMessage], bool] = lambda m: True
) -> NodeMessage:
    """The next frame of this kind that satisfies `pred` (heartbeats and the rest are read past)."""
    async with asyncio.timeout(600):
        while True:
            msg = await link.recv()
            assert msg is not None, "the node ended the stream"
            if msg.WhichOneof("msg") == kind and pred(msg):
                return msg


def server_ms() -> int:
    return int(virtual_clock().now() * 1000)


async def welcome(link: SimLink[NodeMessage, GatewayMessage], epoch: int) -> session_pb2.Hello:
    hello = (await expect(link, "hello")).hello
    w = session_pb2.Welcome(server_time_ms=server_ms(), session_epoch=epoch, heartbeat_interval_ms=10_000)
    await link.send(GatewayMessage(welcome=w))
    return hello


def desired_state(generation: int, spec_hash: str) -> GatewayMessage:
    body = session_pb2.DesiredStateBody(
        node_id=NODE, generation=generation, spec_hash=spec_hash, full=spec_pb2.NodeSpec()
    )
    env = common_pb2.Envelope(purpose="desired-state", body=body.SerializeToString())
    return GatewayMessage(desired_state=session_pb2.DesiredState(envelope=env))


def command(command_id: str) -> GatewayMessage:
    payload = any_pb2.Any()
    payload.Pack(kinds_pb2.InventoryRefreshRequest())
    body = session_pb2.CommandBody(
        id=command_id, node_id=NODE, kind="inventory.refresh", not_after_ms=server_ms() + 60_000, payload=payload
    )
    env = common_pb2.Envelope(purpose="command", body=body.SerializeToString())
    return GatewayMessage(command=session_pb2.Command(envelope=env))


def test_a_session_takes_a_spec_and_a_command_then_a_typed_revocation_stops_the_agent(tmp_path: Path) -> None:
    async def scenario() -> None:
        gw = Gateway()
        agent, held = build(tmp_path, 1, gw)
        task = asyncio.create_task(agent.run())
        link = await gw.accept()
        hello = await welcome(link, epoch=1)
        assert (hello.node_id, hello.journal_id, hello.incarnation_id) == (
            NODE,
            agent.journal.journal_id,
            agent.incarnation_id,
        )

        await link.send(desired_state(1, "hash-1"))
        status = await expect(link, "status", lambda m: m.status.observed_generation == 1)
        assert (status.status.applied_generation, status.status.applied_spec_hash) == (1, "hash-1")

        await link.send(command("c1"))
        done = await expect(
            link,
            "command_update",
            lambda m: m.command_update.command_id == "c1" and m.command_update.state == session_pb2.COMMAND_SUCCEEDED,
        )
        assert done.command_update.node_sig, "a result leaves signed by the node key"

        # The gateway says why in a notice, then closes with the typed code.
        await link.send(GatewayMessage(revocation=session_pb2.RevocationNotice(reason="stolen", serials=["ab"])))
        await link.close("UNAUTHENTICATED", "certificate revoked: stolen", closing.REVOKED)
        await asyncio.wait_for(task, 60)
        assert agent.revoked_reason == "certificate revoked: stolen"
        assert held.saved[-1].revoked == "certificate revoked: stolen"
        await asyncio.sleep(3600)
        assert len(gw.dialed_at) == 1, "a revoked node never dials again"

    run(scenario())


def gpu_reset(command_id: str, gpu_uuid: str) -> GatewayMessage:
    payload = any_pb2.Any()
    payload.Pack(kinds_pb2.GpuResetRequest(gpu_uuids=[gpu_uuid]))
    body = session_pb2.CommandBody(
        id=command_id,
        node_id=NODE,
        kind="gpu.reset",
        not_after_ms=server_ms() + 600_000,
        payload=payload,
    )
    env = common_pb2.Envelope(purpose="command", body=body.SerializeToString())
    return GatewayMessage(command=session_pb2.Command(envelope=env))


def test_a_result_settled_between_the_hello_and_the_welcome_reaches_that_session(tmp_path: Path) -> None:
    """CI saw it: the Hello read the journal while a reset ran, the reset ended before the Welcome, and its result
    went to no session (none was attached) and into no Hello; the command stayed RUNNING until the next session."""

    async def scenario() -> None:
        gw = Gateway()
        agent, _ = build(tmp_path, 1, gw)
        assert isinstance(agent.hw, FakeHardware)
        agent.hw.reset_seconds = 3.0
        task = asyncio.create_task(agent.run())
        link = await gw.accept()
        await welcome(link, epoch=1)
        await link.send(desired_state(1, "hash-1"))
        await expect(link, "status", lambda m: m.status.observed_generation == 1)
        gpu = agent.hw.inventory().gpus[0].uuid
        await link.send(gpu_reset("r1", gpu))
        await expect(link, "command_update", lambda m: m.command_update.state == session_pb2.COMMAND_RUNNING)
        await link.close("UNAVAILABLE", "gateway restarted", closing.UNSPECIFIED)

        link = await gw.accept()
        hello = (await expect(link, "hello")).hello
        assert list(hello.running_command_ids) == ["r1"] and not hello.unacked_results
        await asyncio.sleep(5)  # the reset ends while this session waits for its Welcome
        w = session_pb2.Welcome(server_time_ms=server_ms(), session_epoch=2, heartbeat_interval_ms=10_000)
        await link.send(GatewayMessage(welcome=w))
        done = await expect(link, "command_update", lambda m: m.command_update.command_id == "r1")
        assert done.command_update.state == session_pb2.COMMAND_SUCCEEDED
        assert done.command_update.node_sig
        agent.stopped.set()
        await asyncio.wait_for(task, 60)

    run(scenario())


async def closed_after_welcome(
    tmp: Path, code: str, details: str, reason: CloseReason, sessions: int
) -> tuple[Gateway, Agent, HeldIdentity]:
    """Welcome each session, then end it this way; the agent is stopped after `sessions`, if still running."""
    gw = Gateway()
    agent, held = build(tmp, 1, gw)
    task = asyncio.create_task(agent.run())
    for epoch in range(1, sessions + 1):
        link = await gw.accept()
        await welcome(link, epoch)
        await link.close(code, details, reason)
    await asyncio.sleep(3600)  # an hour for it to redial, or not
    agent.stopped.set()
    await asyncio.wait_for(task, 60)
    return gw, agent, held


def test_the_typed_code_decides_not_the_wording(tmp_path: Path) -> None:
    async def scenario() -> None:
        # "revoked" only in words is an ordinary close: the node redials.
        gw, agent, _ = await closed_after_welcome(
            tmp_path / "words", "UNAUTHENTICATED", "certificate revoked: said in words only", closing.UNSPECIFIED, 2
        )
        assert len(gw.dialed_at) > 2 and not agent.revoked_reason  # (the later dials go unanswered)
        # The code alone, with no notice and no telling words, stops it for good.
        gw, agent, held = await closed_after_welcome(
            tmp_path / "code", "UNAUTHENTICATED", "join again", closing.IDENTITY_REPLACED, 1
        )
        assert len(gw.dialed_at) == 1
        assert agent.revoked_reason == held.saved[-1].revoked == "join again"

    run(scenario())


def superseded(seed: int, tmp: Path, sessions: int = 6) -> tuple[list[float], session_pb2.Hello]:
    async def scenario() -> tuple[list[float], session_pb2.Hello]:
        gw = Gateway()
        agent, _held = build(tmp, seed, gw)
        task = asyncio.create_task(agent.run())
        first: session_pb2.Hello | None = None
        for epoch in range(1, sessions + 1):
            link = await gw.accept()
            hello = await welcome(link, epoch)
            first = first or hello
            await link.close("ABORTED", "superseded by a newer session of this node", closing.SUPERSEDED)
        agent.stopped.set()
        await asyncio.wait_for(task, 60)
        assert first is not None and not agent.revoked_reason
        return gw.delays(), first

    return run(scenario())


def test_a_superseded_session_is_redialed_with_back_off_drawn_from_the_seed(tmp_path: Path) -> None:
    delays, hello = superseded(7, tmp_path / "a")
    again, hello_again = superseded(7, tmp_path / "b")
    other, hello_other = superseded(8, tmp_path / "c")
    assert len(delays) == 5
    # Each close is a transport error after Welcome: the back-off steps up, full jitter under 2^attempt s.
    for attempt, d in enumerate(delays, start=1):
        assert 0.0 <= d <= 2.0**attempt
    assert sum(delays) > 0.5
    assert delays == again, "same seed, same delays"
    assert delays != other
    # The ids the seed draws: the journal, the process's incarnation, the fake host's boot.
    seeded = (hello.journal_id, hello.incarnation_id, hello.boot_id)
    assert seeded == (hello_again.journal_id, hello_again.incarnation_id, hello_again.boot_id)
    assert all(
        a != b
        for a, b in zip(seeded, (hello_other.journal_id, hello_other.incarnation_id, hello_other.boot_id), strict=True)
    )


def test_an_agent_meeting_a_field_it_does_not_know_reports_its_section_unsupported_with_the_number(
    tmp_path: Path,
) -> None:
    """A newer writer's spec: field 9 in `telemetry` (NodeSpec field 5) and a NodeSpec field 8 of its own."""

    def field(number: int, payload: bytes) -> bytes:
        assert len(payload) < 128 and number < 16
        return bytes([number << 3 | 2, len(payload)]) + payload

    telemetry = spec_pb2.TelemetrySection(otlp_endpoint="http://c:4317").SerializeToString() + field(9, b"grpc")
    spec_bytes = field(5, telemetry) + field(8, b"\x08\x01")
    body = session_pb2.DesiredStateBody(node_id=NODE, generation=1, spec_hash="hash-1").SerializeToString()
    env = common_pb2.Envelope(purpose="desired-state", body=body + field(4, spec_bytes))

    async def scenario() -> None:
        gw = Gateway()
        agent, _ = build(tmp_path, 3, gw)
        task = asyncio.create_task(agent.run())
        link = await gw.accept()
        await welcome(link, epoch=1)
        await link.send(GatewayMessage(desired_state=session_pb2.DesiredState(envelope=env)))
        status = (await expect(link, "status", lambda m: m.status.applied_generation == 1)).status
        by = {s.section: s for s in status.sections}
        assert by["telemetry"].state == common_pb2.UNSUPPORTED and by["telemetry"].reason == "UnknownFields"
        assert by["telemetry"].message.endswith("does not know: 5.9"), by["telemetry"].message
        assert by["field-8"].state == common_pb2.UNSUPPORTED and "NodeSpec field 8" in by["field-8"].message
        assert by["host"].state == by["devices"].state == common_pb2.CONVERGED
        assert status.observed_generation == 1  # terminal: the rest of the spec is observed
        agent.stopped.set()
        await asyncio.wait_for(task, 60)

    run(scenario())


def test_an_overload_refusal_is_redialed_after_its_retry_after_without_a_back_off_step(tmp_path: Path) -> None:
    """A gateway that sheds load names when to come back (`bc-retry-after-ms`): the node redials then, at most
    60 s later, and its back-off does not step up; a refusal that names no time steps it up as before."""

    async def scenario() -> list[float]:
        gw = Gateway()
        agent, _ = build(tmp_path, 5, gw)
        task = asyncio.create_task(agent.run())
        for ms in (7_300, 250, 600_000, 12_000):  # refused at the Hello, as a saturated gateway refuses
            link = await gw.accept()
            await expect(link, "hello")
            await link.close("RESOURCE_EXHAUSTED", "too many Hello transactions at once", retry_after_ms=ms)
        link = await gw.accept()  # refused with no time named: the back-off's first step
        await expect(link, "hello")
        await link.close("RESOURCE_EXHAUSTED", "too many Hello transactions at once")
        await welcome(await gw.accept(), 1)
        agent.stopped.set()
        await asyncio.wait_for(task, 60)
        return gw.delays()

    delays = run(scenario())
    assert [round(d, 3) for d in delays[:4]] == [7.3, 0.25, 60.0, 12.0]  # the hint, capped at 60 s
    assert 0.0 <= delays[4] <= 2.0  # attempt 1 (under 2 s), not attempt 5 (under 32 s): the hints did not step it


class FailingFirstAccept(MemoryJournal):
    """The memory journal, its first `accepted` write failing as a disk that refuses it would."""

    failed = False

    async def accept(self, a: Acceptance) -> None:
        if not self.failed:
            self.failed = True
            raise OSError(5, "Input/output error")
        await super().accept(a)


def test_a_failed_accept_answers_nothing_ends_the_session_and_the_redelivery_runs(tmp_path: Path) -> None:
    """The session hands a command on without waiting for its accept (pipelined accepts, agent.dispatch); a
    write that fails still ends the session, as when the session awaited it, and the next one runs it."""

    async def scenario() -> None:
        gw = Gateway()
        journals: list[FailingFirstAccept] = []

        def failing(rng: random.Random) -> MemoryJournal:
            journals.append(FailingFirstAccept(new_journal_id(rng)))
            return journals[-1]

        agent, _held = build(tmp_path, 3, gw, failing)
        task = asyncio.create_task(agent.run())
        link = await gw.accept()
        await welcome(link, epoch=1)
        await link.send(command("c1"))
        first: list[NodeMessage] = []
        with contextlib.suppress(LinkClosed):  # the node ends the session
            async with asyncio.timeout(600):
                while (msg := await link.recv()) is not None:
                    first.append(msg)
        assert [j.failed for j in journals] == [True]
        assert not [m for m in first if m.WhichOneof("msg") == "command_update"], "a failed accept was answered"

        link = await gw.accept()  # the node dialed again
        await welcome(link, epoch=2)
        await link.send(command("c1"))  # the gateway delivers it again
        states = []
        async with asyncio.timeout(600):
            while not states or states[-1] != session_pb2.COMMAND_SUCCEEDED:
                states.append((await expect(link, "command_update")).command_update.state)
        assert states == [session_pb2.COMMAND_ACKED, session_pb2.COMMAND_RUNNING, session_pb2.COMMAND_SUCCEEDED]
        agent.stopped.set()
        await asyncio.wait_for(task, 60)

    run(scenario())


@dataclass
class RefusingGateway(Gateway):
    """A gateway whose handshake refuses the node's certificate until `admit` is set (an expired one)."""

    admit: bool = False

    async def dial(self) -> Link[GatewayMessage, NodeMessage]:
        if not self.admit:
            self.dialed_at.append(asyncio.get_running_loop().time())
            raise OSError("the gateway refused the certificate in the TLS handshake")
        return await super().dial()


def test_a_renewed_certificate_cuts_the_back_off_between_refused_dials_short(tmp_path: Path) -> None:
    """The renewer re-joined while the node's handshakes failed: the next dial goes at once, not after the
    back-off the failures built up."""

    async def scenario() -> tuple[float, float]:
        gw = RefusingGateway()
        agent, _ = build(tmp_path, 7, gw)
        task = asyncio.create_task(agent.run())
        while len(gw.dialed_at) < 6:  # the back-off is up to 32 s by now
            await asyncio.sleep(1)
        gw.admit = True
        renewed_at = asyncio.get_running_loop().time()
        agent.on_cert_renewed()  # what the renewer calls once the new pair is stored
        await welcome(await gw.accept(), 1)
        agent.stopped.set()
        await asyncio.wait_for(task, 60)
        return renewed_at, gw.dialed_at[-1]

    renewed_at, dialed_at = run(scenario())
    assert dialed_at - renewed_at < 0.01
