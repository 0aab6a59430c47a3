"""The connectivity state table: which event moves a node's connectivity, from where, and what it records.

Theory of operation. A node's row holds its connectivity (`state`, since when,
why) and its routing row holds where its session is (gateway, epoch, open):

    new --Hello--> connected --close--> disconnected --give up--> unreachable
                       ^                     |                        |
                       +------ Hello --------+------------------------+

    any live state --delete--> deleted --revive--> new

* `HELLO` (a gateway committed a node's Hello): the session epoch rises and
  the session is routed to that gateway, open. The node is `connected`; a
  Hello on a node already connected (it redialled another gateway) keeps its
  `since`, so the routing moves and the state does not.
* `CLOSE` (a session ended: its gateway closed it, or liveness found its
  gateway dead or the session silent) is fenced by the session epoch: it
  applies only to the open session of that epoch, so a session superseded by
  a newer Hello closes nothing. The node is `disconnected`, with the close's
  reason (`session-closed`, `gateway-lost`, `silent`).
* `GIVE_UP` (liveness: disconnected for longer than the lease TTL, plus the
  gateway-loss grace after `gateway-lost`): `unreachable`. Nothing is
  released (I5); a Hello makes the node `connected` again.
* `DELETE` (`bc nodes delete`) tombstones the node and drops its routing;
  `REVIVE` (a new join token for the id) makes it `new` again.

What a transition records: the new state, `since` = now and its reason, all
three only when the state changes. A node already in the target state keeps
all three (a Hello on a connected node), and an event from a state that is
not one of its sources changes nothing. So `since` moves exactly when the
state does, and a node is connected exactly while one session, on one
gateway, is open.

The module is pure (no I/O): `bc.store.connectivity` derives the SQL of
every update from `TABLE`, the callers (`bc.gateway.hello`, the session
driver, `bc.control.nodes.liveness`) name the event, and `apply` is the model the
store's tests check the store against.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace

NEW = "new"
CONNECTED = "connected"
DISCONNECTED = "disconnected"
UNREACHABLE = "unreachable"
DELETED = "deleted"
STATES: tuple[str, ...] = (NEW, CONNECTED, DISCONNECTED, UNREACHABLE, DELETED)
"""Every state, in the order an operator reads them."""
LIVE: frozenset[str] = frozenset({NEW, CONNECTED, DISCONNECTED, UNREACHABLE})
INITIAL = NEW
"""A node row's state when it is created (the column's default), with no `since`."""

HELLO = "hello"
CLOSE = "close"
GIVE_UP = "give-up"
DELETE = "delete"
REVIVE = "revive"
EVENTS: tuple[str, ...] = (HELLO, CLOSE, GIVE_UP, DELETE, REVIVE)

SESSION_CLOSED = "session-closed"
"""A close's reason when its gateway ended the session (the node hung up, was refused, or the gateway stops)."""
GATEWAY_LOST = "gateway-lost"
"""Liveness closed the session: its gateway's lease expired."""
SILENT = "silent"
"""Liveness closed the session: nothing heard from the node for the lease TTL while it was open."""
CLOSE_REASONS: tuple[str, ...] = (SESSION_CLOSED, GATEWAY_LOST, SILENT)
LONG_GRACE_REASONS: frozenset[str] = frozenset({GATEWAY_LOST})
"""A node closed for these reasons waits the gateway-loss grace on top of the lease TTL before `GIVE_UP`: time
enough for the fleet to redial another gateway."""


class Route(enum.Enum):
    """What a transition does to the node's session routing (`node_sessions`)."""

    OPEN = "open"  # epoch + 1, routed to the event's gateway, open
    CLOSE = "close"  # the open session of the event's epoch closes (the epoch fence); any other epoch: no event
    DROP = "drop"  # the routing row goes (a tombstone routes nowhere; a revived node starts again at epoch 1)
    KEEP = "keep"


@dataclass(frozen=True)
class Transition:
    event: str
    sources: frozenset[str]
    """The states the event applies from; from any other the event changes nothing."""
    target: str
    reason: str | None
    """The reason recorded on a change: a fixed word ('' for none), or None for the one the event carries."""
    route: Route


TABLE: dict[str, Transition] = {
    t.event: t
    for t in (
        Transition(HELLO, frozenset({NEW, CONNECTED, DISCONNECTED, UNREACHABLE}), CONNECTED, "", Route.OPEN),
        Transition(CLOSE, frozenset({CONNECTED}), DISCONNECTED, None, Route.CLOSE),
        Transition(GIVE_UP, frozenset({DISCONNECTED}), UNREACHABLE, "", Route.KEEP),
        Transition(DELETE, LIVE, DELETED, "deleted", Route.DROP),
        Transition(REVIVE, frozenset({DELETED}), NEW, "", Route.KEEP),
    )
}


def transition(event: str) -> Transition:
    """The table's row for `event`; ValueError if there is none (a bug, not a silent no)."""
    try:
        return TABLE[event]
    except KeyError:
        raise ValueError(f"unknown connectivity event {event!r}") from None


def moves_from(event: str) -> frozenset[str]:
    """The states `event` changes (its sources but its target): the rows whose `since` and reason it writes."""
    t = transition(event)
    return t.sources - {t.target}


def next_state(current: str, event: str) -> str | None:
    """Where `event` moves a node in `current`; None: it changes nothing (not a source, or already there)."""
    if current not in STATES:
        raise ValueError(f"unknown connectivity state {current!r}")
    return transition(event).target if current in moves_from(event) else None


def recorded_reason(event: str, given: str = "") -> str:
    """The reason a change by `event` records."""
    fixed = transition(event).reason
    return given if fixed is None else fixed


def gives_up_at(since_ms: int, reason: str, lease_ttl_ms: int, grace_ms: int) -> int:
    """When liveness gives up on a node disconnected since `since_ms` for `reason`."""
    return since_ms + lease_ttl_ms + (grace_ms if reason in LONG_GRACE_REASONS else 0)


@dataclass(frozen=True)
class Connectivity:
    """One node's connectivity and routing, as the store holds them (the model of `apply`)."""

    state: str = INITIAL
    since_ms: int | None = None
    reason: str = ""
    gateway_id: str = ""  # where the node's session is routed ('' never, or since a delete)
    epoch: int = 0
    session_open: bool = False


def apply(
    node: Connectivity, event: str, now_ms: int, *, gateway_id: str = "", epoch: int = 0, reason: str = ""
) -> Connectivity:
    """What the store holds after `event`: `gateway_id` names a Hello's gateway, `epoch` the session a
    close ends (fenced: any other epoch, or a closed session, changes nothing), `reason` a close's reason."""
    t = transition(event)
    if node.state not in t.sources:
        return node
    if t.route is Route.CLOSE and not (node.session_open and node.epoch == epoch):
        return node
    out = node
    if node.state != t.target:
        out = replace(out, state=t.target, since_ms=now_ms, reason=recorded_reason(event, reason))
    if t.route is Route.OPEN:
        out = replace(out, gateway_id=gateway_id, epoch=node.epoch + 1, session_open=True)
    elif t.route is Route.CLOSE:
        out = replace(out, session_open=False)
    elif t.route is Route.DROP:
        out = replace(out, gateway_id="", epoch=0, session_open=False)
    return out
