"""What the run's recorder taps for I3's never-backwards half: the specs each agent's journal stores, and
the older desired states heavy chaos's `spec-replay` sends again."""

from __future__ import annotations

from agent.journal_api import AgentJournal, StoredSpec
from agent.memory_journal import MemoryJournal
from bc.protocol.pb import common_pb2, session_pb2
from bc.seams.network import FROM_NODE, TO_NODE
from bc.sim.breaks import OpenJournal
from bc.sim.facts import FactLog, SpecApplied
from bc.sim.record import KEPT_SPECS, Recorder


def opening(journal: AgentJournal) -> OpenJournal:
    async def open_journal() -> AgentJournal:
        return journal

    return open_journal


def stored(generation: int) -> StoredSpec:
    return StoredSpec(generation, f"sha256:g{generation}", b"", None, "", b"")


def spec_frame(generation: int) -> session_pb2.GatewayMessage:
    body = session_pb2.DesiredStateBody(node_id="n1", generation=generation)
    envelope = common_pb2.Envelope(body=body.SerializeToString())
    return session_pb2.GatewayMessage(desired_state=session_pb2.DesiredState(envelope=envelope))


def generation_of(msg: session_pb2.GatewayMessage | None) -> int | None:
    if msg is None:
        return None
    return session_pb2.DesiredStateBody.FromString(msg.desired_state.envelope.body).generation


async def test_each_spec_the_journal_stores_is_a_fact_with_its_journal_id() -> None:
    facts = FactLog()
    now = [1_000]
    rec = Recorder(facts, lambda: now[0])
    journal = await rec.spec_journal("n1", opening(MemoryJournal("j-1")))()
    await journal.store_spec(stored(2))
    now[0] = 2_000
    await journal.store_spec(stored(5))
    assert facts.applied == [SpecApplied(1_000, "n1", "j-1", 2, 1), SpecApplied(2_000, "n1", "j-1", 5, 2)]
    loaded = await journal.load_spec()
    assert loaded is not None and loaded.generation == 5  # stored in the real journal too


async def test_a_stale_spec_is_the_newest_delivered_below_what_the_open_journal_holds() -> None:
    rec = Recorder(FactLog(), lambda: 0)
    inner = MemoryJournal("j-1")
    await inner.store_spec(stored(3))  # held from an earlier process of the same journal
    journal = await rec.spec_journal("n1", opening(inner))()
    assert rec.stale_spec("n1") is None  # nothing delivered yet
    for g in (1, 2, 3):
        rec.tap(TO_NODE, "n1", spec_frame(g), 0.0)
    rec.tap(FROM_NODE, "n1", session_pb2.NodeMessage(), 0.0)  # not a delivery
    assert generation_of(rec.stale_spec("n1")) == 2
    rec.tap(TO_NODE, "n1", spec_frame(4), 0.0)
    await journal.store_spec(stored(4))
    assert generation_of(rec.stale_spec("n1")) == 3
    assert rec.stale_spec("n2") is None  # never opened a journal
    # a journal loss: the fresh journal holds nothing, so no spec is older than what it holds
    await rec.spec_journal("n1", opening(MemoryJournal("j-2")))()
    assert rec.stale_spec("n1") is None


async def test_the_recorder_keeps_a_nodes_newest_deliveries_only() -> None:
    rec = Recorder(FactLog(), lambda: 0)
    journal = await rec.spec_journal("n1", opening(MemoryJournal("j-1")))()
    for g in range(1, KEPT_SPECS + 3):
        rec.tap(TO_NODE, "n1", spec_frame(g), 0.0)
    await journal.store_spec(stored(3))
    assert rec.stale_spec("n1") is None  # 1 and 2 were let go
    await journal.store_spec(stored(KEPT_SPECS + 2))
    assert generation_of(rec.stale_spec("n1")) == KEPT_SPECS + 1


def test_a_frame_a_fenced_gateway_reads_is_not_heard() -> None:
    """I4 counts what the control plane could know: a frame read by a gateway that does not route by its own
    lease rule (a stalled one waking fenced) is not the node heard."""
    facts = FactLog()
    now = [1_000]
    rec = Recorder(facts, lambda: now[0])
    rec.routing = lambda gateway: gateway == "gw-0"
    status = session_pb2.NodeMessage(heartbeat=session_pb2.Heartbeat())
    rec.tap(FROM_NODE, "n1", status, 0.0, "gw-1")
    assert facts.last_heard("n1", 5_000) is None
    now[0] = 2_000
    rec.tap(FROM_NODE, "n1", status, 0.0, "gw-0")
    heard = facts.last_heard("n1", 5_000)
    assert heard is not None and heard.last_ms == 2_000


def test_a_frame_a_stall_held_back_is_heard_as_of_when_it_was_sent() -> None:
    """The loop times the network gives say how long the frame took; the facts keep the store's clock."""
    facts = FactLog()
    rec = Recorder(facts, lambda: 100_000)
    beat = session_pb2.NodeMessage(heartbeat=session_pb2.Heartbeat())
    rec.tap(FROM_NODE, "n1", beat, 1_050.0, "", 1_000.0)  # 50 s in the pipe
    assert facts.last_heard("n1", 200_000) is None
    assert facts.last_late("n1", 200_000) == (100_000, 50_000)
    assert facts.last_late("n1", 99_999) is None
    rec.tap(FROM_NODE, "n1", beat, 1_050.0, "", 1_049.9)  # on time
    heard = facts.last_heard("n1", 200_000)
    assert heard is not None and heard.last_ms == 100_000
