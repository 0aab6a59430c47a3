"""The fleet table's pure rules: unknowns are n/a (never a healthy zero), events apply once by seq,
commands only move forward, and the filter and sort never depend on arrival order."""

from __future__ import annotations

import json
import random

from hypothesis import given
from hypothesis import strategies as st

from bc.protocol.pb import admin_pb2
from tui import fmt
from tui.fleet_model import Inflight, NodeRow, cells, matches, sort_value
from tui.state import FleetState

STATES = ["pending", "dispatched", "acked", "running"]


def ev(seq: int, type_: str, subject: str, data: str = "{}") -> admin_pb2.EventRecord:
    return admin_pb2.EventRecord(seq=seq, type=type_, subject=subject, data_json=data, at_ms=1000 + seq)


def test_what_the_server_did_not_say_is_na_never_zero() -> None:
    info = admin_pb2.NodeInfo(node_id="n1", state="new", last_seen_age_ms=-1, state_age_ms=-1)
    c = cells(NodeRow(info, 0.0, detail=False), Inflight(known=False), 5.0, 0)
    assert c["lanes"][0] == fmt.NA and c["run"][0] == fmt.NA and c["gpus"][0] == fmt.NA
    assert c["heard"][0] == "never" and c["conn"][0] == "new n/a" and c["role"][0] == fmt.NA
    known = cells(NodeRow(info, 0.0, detail=True), Inflight(known=True), 5.0, 0)
    assert known["lanes"][0] == "0/0/0" and known["run"][0] == "0" and known["gpus"][0] == "0/0"


def test_an_age_grows_with_the_time_since_it_was_read() -> None:
    info = admin_pb2.NodeInfo(node_id="n1", state="connected", last_seen_age_ms=2000, state_age_ms=60_000)
    row = NodeRow(info, 10.0, detail=True)
    assert cells(row, Inflight(known=True), 10.0, 0)["heard"][0] == "2s"
    assert cells(row, Inflight(known=True), 13.5, 0)["heard"][0] == "5s"


def test_a_lagging_node_stands_out_with_how_long_it_has_lagged() -> None:
    st_ = FleetState()
    st_.on_server(admin_pb2.ServerInfoResponse(server_time_ms=100_000), 0.0)
    reply = admin_pb2.ListNodesResponse(
        nodes=[admin_pb2.NodeInfo(node_id="n1", state="connected", generation=3, observed_generation=3)], event_seq=1
    )
    st_.on_nodes(reply, 0.0)
    st_.on_event(ev(2, "node.spec", "n1", '{"generation": 4}'))  # at 1002 ms, server time
    c = cells(st_.rows["n1"], st_.inflight, 0.0, 1002 + 90_000)
    assert c["lag"] == ("1m", "warn") and c["gen"] == ("4/0/3", "warn")
    fresh = FleetState()
    fresh.on_server(admin_pb2.ServerInfoResponse(server_time_ms=100_000), 0.0)
    reply.nodes[0].generation = 4
    fresh.on_nodes(reply, 0.0)  # lagging already when first seen: a lower bound
    assert cells(fresh.rows["n1"], fresh.inflight, 0.0, 160_000)["lag"][0] == "≥1m"


@given(st.lists(st.integers(min_value=1, max_value=30), min_size=1, max_size=60))
def test_each_event_is_applied_once_whatever_the_replays(seqs: list[int]) -> None:
    s = FleetState()
    applied = [q for q in seqs if s.on_event(ev(q, "node.status", "n1")) is not False]
    assert applied == sorted(set(applied)) and [e.seq for e in s.events] == applied
    assert s.cursor == max(seqs)


@given(st.lists(st.sampled_from([*STATES, "settled"]), min_size=1, max_size=12), st.randoms())
def test_a_command_never_moves_back_and_a_settled_one_never_returns(steps: list[str], rng: random.Random) -> None:
    inflight = Inflight(known=True)
    order = list(steps)
    rng.shuffle(order)  # replays arrive in any order
    last = -1
    for seq, step in enumerate(order, start=1):
        if step == "settled":
            e = ev(seq, "command.settled", "c1", '{"node_id": "n1", "kind": "logs.collect", "state": "succeeded"}')
        else:
            e = ev(seq, "command.updated", "c1", f'{{"node_id": "n1", "kind": "logs.collect", "state": "{step}"}}')
        inflight.on_event(e, json.loads(e.data_json))
        now = inflight.by_id.get("c1")
        if "c1" in inflight.settled:
            assert now is None
        elif now is not None:
            rank = STATES.index(now[2])
            assert rank >= last
            last = rank
    lanes = inflight.lanes("n1")
    assert lanes is not None and lanes["control"] == 0 and lanes["provision"] == 0


@given(st.lists(st.tuples(st.sampled_from(["connected", "disconnected", "new"]), st.integers(-1, 10_000)), max_size=20))
def test_the_sort_and_the_filter_do_not_depend_on_arrival(rows: list[tuple[str, int]]) -> None:
    made = [
        NodeRow(admin_pb2.NodeInfo(node_id=f"n{i}", state=s, last_seen_age_ms=a, labels={"rack": f"r{i % 3}"}), 0.0)
        for i, (s, a) in enumerate(rows)
    ]
    for column in ("node", "conn", "heard", "gen"):
        a = sorted(made, key=lambda r: sort_value(r, column))
        b = sorted(reversed(made), key=lambda r: sort_value(r, column))
        assert [r.info.node_id for r in a] == [r.info.node_id for r in b]
    for r in made:
        assert matches(r, "") and matches(r, f"{r.info.node_id} rack=")
        assert not matches(r, "no-such-word")
