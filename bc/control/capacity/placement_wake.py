"""Which events can let a waiting reservation fit: the placement loop's reason to pass again (pure).

The loop (`PlacementPass.run_forever`) re-plans the queue on every wake while a reservation waits. Most
wakes change nothing a waiting reservation needs: a node dropping off, a command settling, a spec written.
Only more room or a looser fit can place one: a booking freed (a reservation released, ended, failed, lost,
set aside), a node becoming eligible or bigger (it connects, is uncordoned or released by a job, its labels
or inventory change, it joins), or a new reservation ahead of the queue's end. The loop passes again when
such an event arrives; a pass for any other cause (a window's start or end, a usage cut: the plan's next
wake; a booked window not yet delivered) is unchanged, and a full pass still runs every third of the lease's
TTL, so what this list misses is late by seconds, never lost (docs/capacity.md, "When the loop passes").
"""

from __future__ import annotations

import json

WAKING_TYPES = frozenset(
    {
        # Room freed, or a reservation ahead in the queue gone. A reservation moving forward (waiting, booked,
        # placed, active) takes room and never frees any: those are not here.
        "reservation.submitted",
        "reservation.released",
        "reservation.releasing",
        "reservation.ended",
        "reservation.failed",
        "reservation.lost",
        "reservation.set-aside",
        "reservation.refused",
        # A node eligible again, or bigger.
        "node.connectivity",  # only into `connected`: see `may_fit_more`
        "node.status",  # only with a new inventory
        "node.uncordoned",
        "node.job-hold-released",
        "node.labelled",
        "node.joined",
        "node.rejoined",
        "node.condition",
        "health.gpu.returned",  # a GPU back in placement (docs/health.md)
        # Room taken away cannot place a waiting reservation, but one pinned to the node must now fail.
        "node.deleted",
        "security.node.revoked",
    }
)
"""Every type `may_fit_more` can answer yes for: the store reads only these (`events.of_types_since`)."""


def may_fit_more(type_: str, data: str) -> bool:
    """Whether an event of `type_` with `data` (its JSON text) may let a waiting reservation fit now."""
    if type_ not in WAKING_TYPES:
        return False
    if type_ == "node.connectivity":
        return _field(data, "state") == "connected"
    if type_ == "node.status":
        return bool(_field(data, "inventory_hash"))
    return True


def _field(data: str, key: str) -> object:
    try:
        doc = json.loads(data or "{}")
    except ValueError:
        return None
    return doc.get(key) if isinstance(doc, dict) else None
