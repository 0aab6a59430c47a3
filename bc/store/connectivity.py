"""The SQL of a node's connectivity, derived from the pure table (`bc.protocol.connectivity`).

Every write of `nodes.connectivity`, `connectivity_since_ms` and
`connectivity_reason` is built here from the table's row for its event: the
rows it moves are the table's sources but its target, and it records the
target, `since` = `:t` and the table's reason, so no statement spells a state
transition of its own. `move` is the statement of an event alone; `node_set`
is its SET clause for a statement that writes other columns in the same
update (the Hello's, the tombstone's, the revival's).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from bc.protocol import connectivity as cx
from bc.store.base import Tx

_WORD = re.compile(r"[a-z][a-z-]*")


def _literal(word: str) -> str:
    # The table's words are SQL literals here: checked, so a table edit cannot inject SQL.
    if not _WORD.fullmatch(word):
        raise ValueError(f"connectivity word {word!r} is not a plain word")
    return f"'{word}'"


def in_words(words: Iterable[str], column: str = "connectivity") -> str:
    """`column IN (...)` for these states (or reasons); an empty set matches no row."""
    words = sorted(words)
    return f"{column} IN ({', '.join(_literal(w) for w in words)})" if words else "1 = 0"


def moving(event: str) -> str:
    """The condition of a node row `event` changes."""
    return in_words(cx.moves_from(event))


def node_set(event: str) -> str:
    """The SET clause that applies `event` to a node row within a larger update: rows `event` moves get its
    target, `since` = `:t` and the reason `:cx_reason`; every other row keeps all three."""
    t, when = cx.transition(event), moving(event)
    return (
        f"connectivity = CASE WHEN {when} THEN {_literal(t.target)} ELSE connectivity END,"
        f" connectivity_since_ms = CASE WHEN {when} THEN :t ELSE connectivity_since_ms END,"
        f" connectivity_reason = CASE WHEN {when} THEN :cx_reason ELSE connectivity_reason END"
    )


def node_params(event: str, now_ms: int, reason: str = "") -> dict[str, object]:
    """The parameters `node_set` names."""
    return {"t": now_ms, "cx_reason": cx.recorded_reason(event, reason)}


async def move(tx: Tx, node_id: str, event: str, now_ms: int, reason: str = "") -> bool:
    """Apply `event` to the node's connectivity alone; True when it changed the state."""
    t = cx.transition(event)
    n = await tx.execute(
        "UPDATE nodes SET connectivity = :s, connectivity_since_ms = :t, connectivity_reason = :cx_reason"
        f" WHERE node_id = :n AND {moving(event)}",
        {"s": t.target, "n": node_id, **node_params(event, now_ms, reason)},
    )
    return n == 1
