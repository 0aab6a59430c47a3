"""The simulator's links (bc.seams.network): each fault does what it says, on the virtual loop's clock."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
from collections import Counter
from pathlib import Path
from typing import Any, cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bc.control.capacity.reservations import ReserveRequest, reserve
from bc.control.commands import queue as cmds
from bc.control.nodes import specs
from bc.protocol import closing
from bc.protocol.pb import common_pb2, session_pb2
from bc.protocol.pb.session_pb2 import GatewayMessage, NodeMessage
from bc.seams.link import Link, LinkClosed
from bc.seams.network import FROM_NODE, TO_NODE, LinkFaults, SimNetwork
from bc.seams.virtual_time import run as run_virtual
from bc.sim.pair import SessionPair
from bc.store import commands as cmd_sql
from bc.store import nodes as nodes_sql
from bc.store import reservations as res_sql

Delivered = list[tuple[str, str, object, float]]


def network(seed: int = 1, faults: LinkFaults | None = None) -> tuple[SimNetwork, Delivered]:
    seen: Delivered = []
    net = SimNetwork(
        rng=random.Random(seed),
        faults=faults or LinkFaults.none(),
        tap=lambda d, node, msg, t, _gw, _sent: seen.append((d, node, msg, t)),
    )
    return net, seen


def hb(n: int) -> NodeMessage:
    """A node frame that says which one it is (the applied generation)."""
    return NodeMessage(heartbeat=session_pb2.Heartbeat(applied_generation=n))


def gen(msg: object) -> int:
    return cast(NodeMessage, msg).heartbeat.applied_generation


async def drain(link: Link[Any, Any], within: float = 60.0) -> list[Any]:
    """Everything that arrives until `within` seconds of silence."""
    out: list[Any] = []
    while True:
        try:
            out.append(await asyncio.wait_for(link.recv(), within))
        except TimeoutError:
            return out


async def silent(link: Link[Any, Any], seconds: float) -> bool:
    try:
        await asyncio.wait_for(link.recv(), seconds)
    except TimeoutError:
        return True
    return False


async def test_without_faults_frames_arrive_at_once_in_order_and_are_tapped() -> None:
    net, seen = network()
    node, gw = net.connect("n1")
    t0 = asyncio.get_running_loop().time()
    for i in range(5):
        await node.send(hb(i))
    await gw.send(GatewayMessage(heartbeat=session_pb2.Heartbeat(server_time_ms=7)))
    assert [gen(m) for m in [await gw.recv() for _ in range(5)]] == [0, 1, 2, 3, 4]
    assert (await node.recv()).heartbeat.server_time_ms == 7  # type: ignore[union-attr]
    assert [(d, n, t) for d, n, _, t in seen] == [(FROM_NODE, "n1", t0)] * 5 + [(TO_NODE, "n1", t0)]
    assert not net.stats


async def test_delay_is_drawn_per_frame_within_the_range_and_keeps_the_order() -> None:
    net, seen = network(faults=LinkFaults(delay_ms=(10.0, 50.0)))
    node, gw = net.connect("n1")
    loop = asyncio.get_running_loop()
    sent = []
    for i in range(50):
        sent.append(loop.time())
        await node.send(hb(i))
        await asyncio.sleep(0.005)
    got = await drain(gw, 1.0)
    assert [gen(m) for m in got] == list(range(50))
    arrived = [t for *_, t in seen]
    assert arrived == sorted(arrived)
    assert all(a - s >= 0.010 - 1e-9 for a, s in zip(arrived, sent, strict=True))
    assert max(a - s for a, s in zip(arrived, sent, strict=True)) <= 0.050 + 0.005 * 50
    assert len({round(a - s, 6) for a, s in zip(arrived, sent, strict=True)}) > 10  # drawn, not fixed


async def test_a_drop_silences_its_direction_from_that_frame_on_and_the_other_still_works() -> None:
    net, _ = network(faults=LinkFaults(drop=1.0))
    node, gw = net.connect("n1")
    await node.send(hb(1))
    await node.send(hb(2))
    assert await silent(gw, 120)  # a dead connection: no frame, no close
    net.set_faults("n1", LinkFaults.none())
    await node.send(hb(3))  # the direction stays dead: later frames are lost too
    assert await silent(gw, 120)
    await gw.send(GatewayMessage(heartbeat=session_pb2.Heartbeat(server_time_ms=1)))
    assert (await node.recv()) is not None
    assert net.stats["drops"] == 1 and net.stats["frames_lost"] == 2


async def test_a_drawn_reset_breaks_the_stream_for_both_ends() -> None:
    net, _ = network(faults=LinkFaults(reset=1.0))
    node, gw = net.connect("n1")
    await node.send(hb(1))
    for end in (gw, node):
        with pytest.raises(LinkClosed) as e:
            await end.recv()
        assert e.value.code == "UNAVAILABLE"
    with pytest.raises(LinkClosed):
        await node.send(hb(2))


async def test_duplicates_arrive_twice_but_never_a_hello_or_a_welcome() -> None:
    net, _ = network(faults=LinkFaults(duplicate=1.0))
    node, gw = net.connect("n1")
    await node.send(NodeMessage(hello=session_pb2.Hello(node_id="n1")))
    await node.send(hb(1))
    await node.send(NodeMessage(event_batch=session_pb2.EventBatch(journal_id="j")))
    await gw.send(GatewayMessage(welcome=session_pb2.Welcome(session_epoch=1)))
    kinds = [m.WhichOneof("msg") for m in await drain(gw, 1.0)]
    assert kinds == ["hello", "heartbeat", "heartbeat", "event_batch", "event_batch"]
    assert [m.WhichOneof("msg") for m in await drain(node, 1.0)] == ["welcome"]


async def test_a_reordered_frame_is_overtaken_by_the_next_and_a_last_one_goes_on_alone() -> None:
    net, seen = network(faults=LinkFaults(reorder=1.0, reorder_window_ms=100.0))
    node, gw = net.connect("n1")
    t0 = asyncio.get_running_loop().time()
    for i in range(5):
        await node.send(hb(i))
    assert [gen(m) for m in await drain(gw, 1.0)] == [1, 0, 3, 2, 4]
    assert seen[-1][3] == pytest.approx(t0 + 0.1)  # frame 4 had nothing to overtake it: it waited the window
    assert net.stats["reorders"] == 2


async def test_event_batches_and_trust_bundles_may_be_duplicated_but_never_overtaken() -> None:
    net, _ = network(faults=LinkFaults(reorder=1.0, duplicate=1.0))
    node, gw = net.connect("n1")
    for seq in (1, 2, 3):
        batch = session_pb2.EventBatch(journal_id="j", events=[session_pb2.NodeEvent(seq=seq)])
        await node.send(NodeMessage(event_batch=batch))
        await gw.send(GatewayMessage(trust=common_pb2.Envelope(key_id=str(seq))))
    assert [m.event_batch.events[0].seq for m in await drain(gw, 1.0)] == [1, 1, 2, 2, 3, 3]
    assert [m.trust.key_id for m in await drain(node, 1.0)] == ["1", "1", "2", "2", "3", "3"]


async def test_finding_event_batches_overtaken_in_a_stream_lose_the_earlier_events(tmp_path: Path) -> None:
    """FINDING (asserts the current behaviour): why `event_batch` is not in `TOLERANT`.

    The gateway acks events cumulatively (`bc.gateway.ingest`): a batch that overtakes an earlier one
    moves the ack past the earlier batch's events, the node drops them from its journal on reading that
    ack, and the gateway skips them when they arrive. A gRPC stream never reorders, so production is
    safe; this is the one in-stream fault the protocol cannot take. If ingest ever stores events above a
    gap instead of skipping them, this test fails: then put `event_batch` in `TOLERANT`.
    """
    pair = SessionPair(tmp_path, seed=2, agents=1)
    faults = LinkFaults(reorder=1.0, reorder_window_ms=5000.0, tolerant=frozenset({"event_batch"}))
    net = SimNetwork(rng=random.Random(2), faults=LinkFaults.none())
    pair.network = cast(Any, net)
    await pair.start()
    try:
        await asyncio.sleep(30)
        (node_id,) = pair.node_ids()
        agent = pair.agents[node_id]
        net.set_faults(node_id, faults)  # only event batches are held, each until the next overtakes it
        for marker in ("first", "second", "third"):
            event = session_pb2.NodeEvent(type=f"sim.{marker}")
            await agent.journal.append_events([(event.type, session_pb2.TRANSITION, event.SerializeToString())])
            agent.outbox.poke()
            await asyncio.sleep(1)  # each goes out in a batch of its own
        await asyncio.sleep(30)
        stored = [json.loads(e[3])["type"] for e in await pair.events() if e[1] == "node.event"]
        unacked = await agent.journal.unacked_events()
    finally:
        await pair.stop()
    assert net.stats["reorders"] == 1
    # "first" was overtaken by "second", whose cumulative ack dropped "first" from the journal before it
    # arrived, and the gateway skipped it then: it is nowhere. ("third" had nothing to overtake it within
    # the reorder window: an unchanged status is not re-sent, so only the next heartbeat could.)
    assert stored == ["sim.second", "sim.third"]
    assert unacked == []


async def test_a_stall_holds_frames_then_delivers_them_in_order() -> None:
    net, seen = network()
    node, gw = net.connect("n1")
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    net.stall("n1", 5.0)
    for i in range(3):
        await node.send(hb(i))
        await asyncio.sleep(1)
    assert not seen
    assert [gen(m) for m in await drain(gw, 10)] == [0, 1, 2]
    assert [t for *_, t in seen] == [t0 + 5.0] * 3
    await node.send(hb(3))  # after the stall: at once again
    assert gen(await gw.recv()) == 3 and seen[-1][3] == loop.time()


async def test_the_tap_hears_when_each_frame_was_sent_as_well_as_when_it_arrived() -> None:
    """A frame a stall held back is news of the moment it left (I4 reads it so: bc.sim.facts)."""
    sent: list[tuple[float, float]] = []
    net = SimNetwork(
        rng=random.Random(1), faults=LinkFaults.none(), tap=lambda d, n, m, t, gw, at: sent.append((t, at))
    )
    node, gw = net.connect("n1")
    t0 = asyncio.get_running_loop().time()
    net.stall("n1", 5.0)
    for i in range(3):
        await node.send(hb(i))
        await asyncio.sleep(1)
    await drain(gw, 10)
    assert sent == [(t0 + 5.0, t0 + i) for i in range(3)]


async def test_deliver_again_sends_a_late_copy_on_the_newest_connection() -> None:
    net, seen = network()
    node, _gw = net.connect("n1")
    frame = GatewayMessage(command=session_pb2.Command(batch_approval=b"x"))
    t0 = asyncio.get_running_loop().time()
    assert net.deliver_again("n1", frame, 3.0)
    got = await node.recv()
    assert got == frame and got is not frame and seen[-1][3] == t0 + 3.0
    assert not net.deliver_again("n2", frame, 1.0)  # no connection: nothing sent


async def test_a_stall_also_holds_frames_already_in_flight() -> None:
    net, seen = network(faults=LinkFaults(delay_ms=(100.0, 100.0)))
    node, gw = net.connect("n1")
    t0 = asyncio.get_running_loop().time()
    await node.send(hb(1))
    net.stall("n1", 2.0)
    assert gen(await gw.recv()) == 1
    assert seen[0][3] == t0 + 2.0


@pytest.mark.parametrize("cut", ["to_node", "from_node"])
async def test_a_one_way_partition_cuts_one_direction_refuses_dials_and_heals(cut: str) -> None:
    net, _ = network()
    net.gateway = cast(Any, object())  # dials need a gateway; none is reached here
    node, gw = net.connect("n1")
    net.partition(["n1"], direction=cast(Any, cut))
    net.partition(["n2"])  # another node's cut changes nothing here
    await gw.send(GatewayMessage(heartbeat=session_pb2.Heartbeat(server_time_ms=1)))
    await node.send(hb(1))
    cut_end, open_end = (node, gw) if cut == "to_node" else (gw, node)
    assert await open_end.recv() is not None  # the other direction: still through
    assert await silent(cut_end, 60)  # the cut one: lost, not closed
    with pytest.raises(ConnectionRefusedError):
        await net.dialer("n1")()
    net.heal(["n1"])
    await gw.send(GatewayMessage(heartbeat=session_pb2.Heartbeat(server_time_ms=2)))
    await node.send(hb(2))
    assert (await node.recv()).heartbeat.server_time_ms == 2  # type: ignore[union-attr]
    assert gen(await gw.recv()) == 2


async def test_a_stall_holds_a_connection_dialled_during_it_too() -> None:
    net, seen = network()
    t0 = asyncio.get_running_loop().time()
    net.stall("n1", 3.0)
    node, gw = net.connect("n1")
    await node.send(NodeMessage(hello=session_pb2.Hello(node_id="n1")))
    assert (await gw.recv()).WhichOneof("msg") == "hello"  # type: ignore[union-attr]
    assert seen[0][3] == t0 + 3.0


async def test_a_frame_in_flight_when_the_cut_comes_is_lost() -> None:
    net, _ = network(faults=LinkFaults(delay_ms=(100.0, 100.0)))
    node, gw = net.connect("n1")
    await node.send(hb(1))
    net.partition(["n1"])  # `partitioned` is the live set SessionPair updates
    assert await silent(gw, 1.0)
    net.partitioned.clear()
    assert await silent(gw, 60)  # lost, not held


async def test_half_open_gives_silence_never_a_close_and_a_new_dial_works() -> None:
    net, _ = network()
    node, gw = net.connect("n1")
    net.half_open("n1")
    await node.send(hb(1))
    await node.close("CANCELLED", "no frame from the gateway for 3 heartbeat intervals")
    assert await silent(gw, 600)
    await gw.send(GatewayMessage(heartbeat=session_pb2.Heartbeat(server_time_ms=1)))  # no error: it cannot know
    node2, gw2 = net.connect("n1")
    await node2.send(hb(2))
    assert gen(await gw2.recv()) == 2


async def test_reset_raises_unavailable_on_both_ends_and_wakes_a_waiting_recv() -> None:
    net, _ = network(faults=LinkFaults(delay_ms=(50.0, 50.0)))
    node, gw = net.connect("n1")
    await node.send(hb(1))  # in flight: gone with the stream
    waiting = asyncio.create_task(node.recv())
    await asyncio.sleep(0.01)
    net.reset("n1")
    for recv in (waiting, asyncio.create_task(gw.recv())):
        with pytest.raises(LinkClosed) as e:
            await recv
        assert e.value.code == "UNAVAILABLE"
    with pytest.raises(LinkClosed):
        await gw.send(GatewayMessage())


async def test_a_close_follows_the_frames_before_it_and_carries_its_reason() -> None:
    net, _ = network(faults=LinkFaults(delay_ms=(1.0, 30.0)))
    node, gw = net.connect("n1")
    for i in range(3):
        await gw.send(GatewayMessage(heartbeat=session_pb2.Heartbeat(server_time_ms=i + 1)))
    await gw.close("UNAUTHENTICATED", "certificate revoked", closing.REVOKED)
    with pytest.raises(LinkClosed):
        await gw.send(GatewayMessage())
    got = [(await node.recv()).heartbeat.server_time_ms for _ in range(3)]  # type: ignore[union-attr]
    assert got == [1, 2, 3]
    for _ in range(2):  # and says so again on every later recv
        with pytest.raises(LinkClosed) as e:
            await node.recv()
        assert (e.value.code, e.value.reason) == ("UNAUTHENTICATED", closing.REVOKED)
    with pytest.raises(LinkClosed):
        await node.send(hb(1))  # the peer's close reached this end


class FakeGateway:
    def __init__(self) -> None:
        self.served: list[tuple[Link[NodeMessage, GatewayMessage], object]] = []

    async def serve(self, link: Link[NodeMessage, GatewayMessage], peer: object) -> None:
        self.served.append((link, peer))


async def test_the_dialer_serves_the_gateway_end_through_wrap_and_refuses_without_a_gateway() -> None:
    net, _ = network()
    net.peers["n1"] = cast(Any, "peer-n1")
    dial = net.dialer("n1")
    with pytest.raises(ConnectionRefusedError):
        await dial()
    fake = FakeGateway()
    net.set_gateway(cast(Any, fake))
    wrapped: list[str] = []

    def wrap(node_id: str, link: Link[NodeMessage, GatewayMessage]) -> Link[NodeMessage, GatewayMessage]:
        wrapped.append(node_id)
        return link

    net.wrap = wrap
    node = await dial()
    await asyncio.gather(*net.sessions)
    assert wrapped == ["n1"] and fake.served[0][1] == "peer-n1"
    await node.send(hb(9))
    assert gen(await fake.served[0][0].recv()) == 9
    assert net.dials["n1"] == 2


def _heavy_run(seed: int) -> list[tuple[str, int, float]]:
    """Twenty connections under heavy faults, both ends read; what was delivered, when."""

    async def read(link: Link[Any, Any]) -> None:
        with contextlib.suppress(LinkClosed):
            while True:
                await link.recv()

    async def go() -> list[tuple[str, int, float]]:
        net, seen = network(seed, LinkFaults.heavy())
        for round_ in range(20):
            node, gw = net.connect("n1")
            readers = [asyncio.create_task(read(node)), asyncio.create_task(read(gw))]
            with contextlib.suppress(LinkClosed):  # a drawn reset ends the round early
                for i in range(50):
                    await node.send(hb(round_ * 100 + i))
                    await gw.send(GatewayMessage(heartbeat=session_pb2.Heartbeat(server_time_ms=round_ * 100 + i)))
                    await asyncio.sleep(0.05)
            await asyncio.sleep(10)
            net.reset("n1")
            await asyncio.gather(*readers)
        out = []
        for d, _node, m, t in seen:
            if isinstance(m, NodeMessage):
                out.append((d, m.heartbeat.applied_generation, t))
            else:
                out.append((d, cast(GatewayMessage, m).heartbeat.server_time_ms, t))
        return out

    return run_virtual(go())


def test_one_seed_one_delivered_sequence_with_its_times() -> None:
    a, b, c = _heavy_run(5), _heavy_run(5), _heavy_run(6)
    assert a == b
    assert a != c
    assert len(a) > 100


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 2**32),
    delay=st.tuples(st.floats(0, 300), st.floats(0, 300)).map(sorted),
    stall=st.floats(0, 0.3),
    gaps=st.lists(st.floats(0, 0.2), min_size=1, max_size=40),
)
def test_latency_and_stalls_never_lose_duplicate_or_reorder(
    seed: int, delay: list[float], stall: float, gaps: list[float]
) -> None:
    faults = LinkFaults(delay_ms=(delay[0], delay[1]), stall=stall, stall_ms=(0.0, 3000.0))

    async def go() -> list[int]:
        net, _ = network(seed, faults)
        node, gw = net.connect("n1")
        for i, gap in enumerate(gaps):
            await node.send(hb(i))
            await asyncio.sleep(gap)
        return [gen(m) for m in await drain(gw, 10.0)]

    assert run_virtual(go()) == list(range(len(gaps)))


async def test_a_heavy_network_between_real_agents_and_the_gateway_still_converges(tmp_path: Path) -> None:
    pair = SessionPair(tmp_path, seed=6, agents=3)
    net = SimNetwork(rng=random.Random(6), faults=LinkFaults.heavy())
    pair.network = cast(Any, net)  # the fleet runner's one-line swap
    await pair.start()
    try:
        await asyncio.sleep(60)
        assert pair.cp is not None
        node = pair.node_ids()[0]
        held = await reserve(pair.store, pair.cp.bus, pair.cp.signer, ReserveRequest(gpus=2, node_id=node), pair.rng)
        await asyncio.sleep(7 * 60)
        net.faults = LinkFaults.none()  # the chaos ends; two minutes later every node must be back
        await asyncio.sleep(150)
        end = await pair.connectivity()
        async with pair.store.transaction(write=False) as tx:
            after = await res_sql.get(tx, str(held["id"]))
        events = await pair.events()
    finally:
        await pair.stop()
    assert set(end.values()) == {"connected"}, end
    assert after is not None and after["state"] == "active"
    assert net.stats["drops"] > 0 and net.stats["duplicates"] > 0 and net.stats["reorders"] > 0, net.stats
    sessions = [e for e in events if e[1] == "node.connectivity" and json.loads(e[3])["state"] == "connected"]
    assert len(sessions) > 3  # the faults ended sessions, and the nodes came back


async def test_in_stream_duplicates_and_reordering_never_end_a_session_nor_run_a_command_twice(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Far more than `heavy`, of the kinds the cores are said to tolerate (`TOLERANT`): nothing else fails."""
    caplog.set_level(logging.INFO, logger="agent")
    pair = SessionPair(tmp_path, seed=5, agents=3)
    faults = LinkFaults(delay_ms=(0.0, 50.0), duplicate=0.3, reorder=0.3, reorder_window_ms=5000.0)
    net = SimNetwork(rng=random.Random(5), faults=faults)
    pair.network = cast(Any, net)
    rng = random.Random(5)
    await pair.start()
    try:
        await asyncio.sleep(20)
        assert pair.cp is not None
        cp = pair.cp
        held = [
            await reserve(pair.store, cp.bus, cp.signer, ReserveRequest(gpus=2, node_id=n), pair.rng)
            for n in pair.node_ids()
        ]
        ids = []
        for step in range(8):
            for n in pair.node_ids():
                kind = rng.choice(["inventory.refresh", "diag.nvml", "logs.collect"])
                req = cmds.EnqueueRequest(n, kind, cmds.payload_from_json(kind, ""), not_after_s=600.0)
                ids.append(str((await cmds.enqueue(pair.store, cp.bus, cp.signer, req, rng))["id"]))
                if step % 2 == 0:
                    telemetry = json.dumps({"otlp_endpoint": f"http://c{step}.sim:4317", "export_interval_s": 10})
                    await specs.set_section(pair.store, cp.bus, cp.signer, n, "telemetry", telemetry)
            await asyncio.sleep(rng.uniform(0, 10))
        await asyncio.sleep(120)
        async with pair.store.transaction(write=False) as tx:
            reservations = [(await res_sql.get(tx, str(h["id"])) or {}).get("state") for h in held]
            commands = [str((await cmd_sql.get(tx, i) or {}).get("state")) for i in ids]
            nodes = await nodes_sql.list_all(tx)
        events = await pair.events()
    finally:
        await pair.stop()
    assert net.stats["duplicates"] > 50 and net.stats["reorders"] > 20, net.stats
    connectivity = [json.loads(e[3])["state"] for e in events if e[1] == "node.connectivity"]
    assert connectivity == ["connected"] * 3  # no session ended: every frame was taken as it came
    assert reservations == ["active"] * 3
    assert commands == ["succeeded"] * len(ids)
    assert all(int(r["observed_generation"]) == int(r["generation"]) for r in nodes)
    started = Counter(
        r.getMessage().split()[1] for r in caplog.records if r.getMessage().startswith("event=command.running")
    )
    assert sorted(started) == sorted(f"command={i}" for i in ids) and set(started.values()) == {1}


async def test_a_drawn_fault_is_told_once_it_is_in_effect() -> None:
    """`on_drawn` (and `stats`, counted at the same moment) see the fault already done: a watcher can find it."""
    net, _ = network(faults=LinkFaults(reset=1.0))
    told: list[tuple[str, str, bool]] = []
    node, gw = net.connect("n1")
    net.on_drawn = lambda kind, node_id, t: told.append((kind, node_id, net.stats[kind] == 1))
    await node.send(hb(1))
    assert told == [("resets", "n1", True)]
    with pytest.raises(LinkClosed):
        await gw.recv()
    net.set_faults("n1", LinkFaults(drop=1.0))
    _, gw2 = net.connect("n1")
    await gw2.send(GatewayMessage())
    assert told[-1] == ("drops", "n1", True)
    net.reset("n1")  # the controls are the caller's: not told, not counted
    net.partition(iter(["n1"]))
    net.heal(iter(["n1"]))
    assert len(told) == 2 and net.stats == {"resets": 1, "drops": 1} and not net.partitioned


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**32),
    duplicate=st.floats(0, 1),
    reorder=st.floats(0, 1),
    window_ms=st.floats(1, 500),
    gaps=st.lists(st.floats(0, 0.3), min_size=1, max_size=40),
)
def test_duplicates_and_reordering_lose_nothing_and_move_a_frame_at_most_one_place(
    seed: int, duplicate: float, reorder: float, window_ms: float, gaps: list[float]
) -> None:
    faults = LinkFaults(delay_ms=(0.0, 100.0), duplicate=duplicate, reorder=reorder, reorder_window_ms=window_ms)

    async def go() -> tuple[list[int], SimNetwork]:
        net, _ = network(seed, faults)
        node, gw = net.connect("n1")
        for i, gap in enumerate(gaps):
            await node.send(hb(i))
            await asyncio.sleep(gap)
        return [gen(m) for m in await drain(gw, 10.0)], net

    got, net = run_virtual(go())
    counts = Counter(got)
    assert sorted(counts) == list(range(len(gaps)))  # every frame, none invented
    assert set(counts.values()) <= {1, 2} and sum(counts.values()) - len(gaps) == net.stats["duplicates"]
    firsts = list(dict.fromkeys(got))
    assert all(abs(pos - i) <= 1 for pos, i in enumerate(firsts))  # only neighbours swap


async def test_a_stall_of_a_node_that_says_nothing_more_is_forgotten_when_it_ends() -> None:
    net, _ = network()
    net.stall("gone", 5.0)
    net.stall("gone", 1.0)  # within the longer one: changes nothing
    await asyncio.sleep(4)
    assert net.stalled
    await asyncio.sleep(2)
    assert not net.stalled  # other nodes' frames take the fast path again


def spec_frame(generation: int) -> GatewayMessage:
    body = session_pb2.DesiredStateBody(node_id="n1", generation=generation)
    return GatewayMessage(
        desired_state=session_pb2.DesiredState(envelope=common_pb2.Envelope(body=body.SerializeToString()))
    )


def spec_gen(msg: object) -> int:
    env = cast(GatewayMessage, msg).desired_state.envelope
    return session_pb2.DesiredStateBody.FromString(env.body).generation


async def test_a_replayed_spec_arrives_again_behind_what_is_in_flight_and_only_after_the_welcome() -> None:
    net, seen = network(faults=LinkFaults(delay_ms=(50.0, 50.0)))
    node, gw = net.connect("n1")
    assert not net.replay("n1", spec_frame(1))  # nothing reached the node yet: its Welcome comes first
    await gw.send(GatewayMessage(welcome=session_pb2.Welcome(session_epoch=1)))
    await gw.send(spec_frame(1))
    await gw.send(spec_frame(2))
    assert [m.WhichOneof("msg") for m in await drain(node, 1.0)] == ["welcome", "desired_state", "desired_state"]
    await gw.send(spec_frame(3))  # in flight when the replay is sent
    assert net.replay("n1", spec_frame(1))
    assert [spec_gen(m) for m in await drain(node, 1.0)] == [3, 1]
    assert [spec_gen(m) for d, _, m, _ in seen if d == TO_NODE and m.WhichOneof("msg") == "desired_state"] == [
        1,
        2,
        3,
        1,
    ]
    assert not net.stats  # a control, not a fault the links drew


async def test_a_replay_goes_nowhere_without_a_live_connection() -> None:
    net, _ = network()
    node, gw = net.connect("n1")
    await gw.send(GatewayMessage(welcome=session_pb2.Welcome(session_epoch=1)))
    await node.recv()
    net.reset("n1")
    assert not net.replay("n1", spec_frame(1))
    assert not net.replay("n2", spec_frame(1))  # a node that never connected
