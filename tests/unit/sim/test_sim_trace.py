"""A failed invariant's short trace: the last events that touched what its counterexample names."""

from __future__ import annotations

from dataclasses import dataclass

from bc.sim.checkers import entities_of
from bc.sim.trace import trace


@dataclass(frozen=True)
class Start:
    node_id: str
    command_id: str


@dataclass(frozen=True)
class Twice:
    first: Start
    second: Start
    why: str


def test_the_entities_are_the_ids_in_the_counterexample_and_its_parts_each_once() -> None:
    found = Twice(Start("n1", "c1"), Start("n1", "c1"), "no journal")
    assert entities_of(found) == ("n1", "c1")
    assert entities_of([Start("n2", "")]) == ("n2",)


EVENTS = [
    (1, "node.joined", "n1", "{}", 1_000),
    (2, "node.joined", "n2", "{}", 1_000),
    (3, "command.queued", "c1", '{"node_id": "n1"}', 2_000),
    (4, "command.queued", "c2", '{"node_id": "n2"}', 2_000),
    (5, "node.connectivity", "n1", '{"state": "disconnected"}', 5_000),
    (6, "node.connectivity", "n1", '{"state": "connected"}', 60_000),  # long after: not part of the story
]


def test_the_trace_is_the_last_events_naming_an_entity_up_to_the_violation() -> None:
    lines = trace(EVENTS, ["n1"], at_ms=5_000, last=2)
    assert lines == [
        '00:00:02.000 command.queued c1 {"node_id": "n1"}',  # its data names n1
        '00:00:05.000 node.connectivity n1 {"state": "disconnected"}',
    ]
    assert len(trace(EVENTS, ["n1"], at_ms=None)) == 4  # no time: every event that touched it
    assert trace(EVENTS, [], at_ms=5_000) == []
