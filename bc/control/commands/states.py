"""The command state table: which report from a node moves a command, and where to.

Theory of operation. A command lives on a line

    pending < dispatched < acked < running < terminal

where terminal is one of succeeded, failed, rejected, cancelled (reported by
the node) or expired (set by the sweeper; failed `timeout` is the sweeper's
too). Delivery is at least once and reports may be lost or repeated, so the
table is written for that:

* a report moves a command only forward: `ACKED` after `RUNNING` is stale,
  a repeated `RUNNING` is a repeat, and both change nothing (`None`);
* reports may skip steps: a lost `ACKED` (or a lost dispatch mark) does not
  stop `RUNNING` or a result from landing;
* a terminal state never changes, whatever arrives after it, so the first
  outcome stored is the one that stands.

The module is pure (no I/O): `bc.control.commands.queue` applies it inside the
update transaction, and the simulator's checkers can use it as the oracle.
"""

from __future__ import annotations

from bc.protocol.pb import session_pb2

PENDING = "pending"
DISPATCHED = "dispatched"
ACKED = "acked"
RUNNING = "running"
SUCCEEDED = "succeeded"
FAILED = "failed"
REJECTED = "rejected"
CANCELLED = "cancelled"
EXPIRED = "expired"

TERMINAL: frozenset[str] = frozenset({SUCCEEDED, FAILED, REJECTED, CANCELLED, EXPIRED})
IN_FLIGHT: frozenset[str] = frozenset({DISPATCHED, ACKED, RUNNING})
STATES: tuple[str, ...] = (PENDING, DISPATCHED, ACKED, RUNNING, SUCCEEDED, FAILED, REJECTED, CANCELLED, EXPIRED)
"""Every state, in the order an operator reads them (the CLI's --state choices)."""

UPDATE_STATES: dict[int, str] = {
    session_pb2.COMMAND_ACKED: ACKED,
    session_pb2.COMMAND_RUNNING: RUNNING,
    session_pb2.COMMAND_SUCCEEDED: SUCCEEDED,
    session_pb2.COMMAND_FAILED: FAILED,
    session_pb2.COMMAND_REJECTED: REJECTED,
    session_pb2.COMMAND_CANCELLED: CANCELLED,
}
"""A node's `CommandState` to the state it reports; `COMMAND_STATE_UNSPECIFIED` is not a report."""

_TERMINAL_RANK = 4
_RANK: dict[str, int] = {PENDING: 0, DISPATCHED: 1, ACKED: 2, RUNNING: 3} | dict.fromkeys(TERMINAL, _TERMINAL_RANK)


def rank(state: str) -> int:
    """A state's place on the line (every terminal state shares the last place); ValueError if unknown."""
    try:
        return _RANK[state]
    except KeyError:
        raise ValueError(f"unknown command state {state!r}") from None


def state_name(update: session_pb2.CommandState | int) -> str | None:
    """The state a `CommandState` reports, or None for one that reports nothing."""
    return UPDATE_STATES.get(int(update))


def next_state(current: str, update: session_pb2.CommandState | int) -> str | None:
    """Where a node's report moves a command in `current`; None: stale or repeated, change nothing."""
    target = state_name(update)
    if target is None or current in TERMINAL:
        return None
    if rank(target) <= rank(current):
        return None
    return target


def is_terminal(state: str) -> bool:
    return state in TERMINAL
