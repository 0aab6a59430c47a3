"""Which gateway a node dials first (agent.session.grpc_dial.Rotation) and how `--server` lists parse."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from agent.join import servers_of
from agent.session.grpc_dial import MAX_CONNECT_TIMEOUT_S, PER_ADDRESS_TIMEOUT_S, STICKY_S, Rotation
from bc.errors import UsageError


def test_a_node_stays_with_the_gateway_that_kept_it_and_moves_on_from_one_that_did_not() -> None:
    r = Rotation(["b:1", "a:1", "c:1"])
    assert r.order(0.0) == ["b:1", "a:1", "c:1"]
    r.connected("b:1", 1.0)
    assert r.order(1.0 + STICKY_S + 5) == ["b:1", "a:1", "c:1"]  # a long session ended: b first again
    r.connected("b:1", 100.0)
    assert r.order(101.0) == ["a:1", "c:1", "b:1"]  # refused or fenced at once: the next gateway first
    r.connected("c:1", 102.0)
    assert r.order(102.0 + STICKY_S) == ["c:1", "b:1", "a:1"]


def test_with_an_rng_the_survivors_of_a_dead_first_gateway_share_its_nodes() -> None:
    rng = random.Random(3)
    nexts: Counter[str] = Counter()
    for _ in range(3000):  # 3,000 nodes joined with one list, all homed on a:1, which dies
        r = Rotation(["a:1", "b:1", "c:1", "d:1"], rng)
        order = r.order(0.0)
        assert order[0] == "a:1" and sorted(order[1:]) == ["b:1", "c:1", "d:1"]
        nexts[order[1]] += 1
    assert all(900 < nexts[a] < 1100 for a in ("b:1", "c:1", "d:1")), nexts
    r = Rotation(["a:1", "b:1", "c:1"], rng)
    r.connected("b:1", 0.0)
    assert r.order(STICKY_S + 1)[0] == "b:1"  # still sticky to the gateway that kept it
    assert r.order(STICKY_S + 2)[0] == "b:1"
    r.connected("b:1", 100.0)
    assert r.order(101.0)[0] == "c:1"  # and still moving on from one that did not


def test_one_gateway_is_always_first() -> None:
    r = Rotation(["a:1"])
    r.connected("a:1", 0.0)
    assert r.order(0.5) == ["a:1"]


def test_server_lists_parse_and_refuse_what_is_not_host_port() -> None:
    assert servers_of("a:1, b:2,") == ["a:1", "b:2"]
    with pytest.raises(UsageError):
        servers_of(" , ")
    with pytest.raises(UsageError):
        servers_of("a:1,b")


def test_patience_grows_with_dials_that_reached_no_gateway_and_resets_on_a_connect() -> None:
    """A reconnect storm makes handshakes slow, not refused: a fixed 2 s per address would close every
    channel just before its handshake finished. Each dial in a row that reached none doubles the wait."""
    r = Rotation(["a:1", "b:1", "c:1"])
    waits = []
    for _ in range(7):
        waits.append(r.timeout(PER_ADDRESS_TIMEOUT_S))
        r.missed()
    assert waits == [2.0, 4.0, 8.0, 16.0, MAX_CONNECT_TIMEOUT_S, MAX_CONNECT_TIMEOUT_S, MAX_CONNECT_TIMEOUT_S]
    r.connected("b:1", 100.0)
    assert r.timeout(PER_ADDRESS_TIMEOUT_S) == PER_ADDRESS_TIMEOUT_S
