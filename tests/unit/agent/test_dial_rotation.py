"""Which gateway a node dials first (agent.session.grpc_dial.Rotation) and how `--server` lists parse."""

from __future__ import annotations

import pytest

from agent.join import servers_of
from agent.session.grpc_dial import STICKY_S, Rotation
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
