"""Where an aimed XID of `bc.sim.storms.aimed` strikes, at its time: read from the store, then chosen by the
run's own aim Random (`Fleet`'s `bc-sim-storm-aim:<seed>`, so no other draw of the run moves).

`held`: a GPU an active reservation's booking holds now; `again`: a GPU whose last episode ended `done` (a
second failure within the repeat window, which the policy quarantines), else `cleared`. Either way not a GPU
with an open episode (the XID would join it: no new episode) nor one kept out for a person (none opens). With
no such GPU, the fault stays where it was drawn.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from dataclasses import replace

from bc.sim.chaos import Fault
from bc.sim.storms import AIM_AGAIN, AIM_HELD
from bc.store import Row, Store, StoreError
from bc.store import capacity as cap_sql
from bc.store import health as health_sql

Gpu = tuple[str, str]


def held(bookings: Iterable[Row], now_ms: int) -> set[Gpu]:
    """GPUs an active reservation holds at `now_ms`."""
    return {
        (str(b["node_id"]), str(b["gpu_uuid"]))
        for b in bookings
        if str(b["state"]) == "active"
        and b["gpu_uuid"]
        and int(b["start_ms"]) <= now_ms
        and (b["end_ms"] is None or int(b["end_ms"]) > now_ms)
    }


def ended(episodes: Iterable[Row], state: str) -> set[Gpu]:
    """GPUs whose newest ended episode (rows newest first) ended in `state`."""
    seen: set[Gpu] = set()
    out: set[Gpu] = set()
    for r in episodes:
        key = (str(r["node_id"]), str(r["gpu_uuid"]))
        if key in seen or not key[1]:
            continue
        seen.add(key)
        if str(r["state"]) == state:
            out.add(key)
    return out


def choose(f: Fault, pools: Sequence[set[Gpu]], excluded: set[Gpu], rng: random.Random) -> Fault:
    """`f` moved to a GPU of the first pool with one outside `excluded` (the GPU named by its uuid), or as it was."""
    for pool in pools:
        fits = sorted(pool - excluded)
        if fits:
            node_id, gpu = fits[rng.randrange(len(fits))]
            return replace(f, targets=(node_id,), params={**f.params, "gpu": gpu})
    return f


async def aim(f: Fault, store: Store, rng: random.Random) -> Fault:
    """`f` moved where its `aim` says (see the module docstring); as drawn when the store is out."""
    try:
        now_ms = await store.now_ms()
        async with store.transaction(write=False) as tx:
            busy = await cap_sql.live_bookings(tx) if f.params["aim"] == AIM_HELD else []
            recent = await health_sql.recent_episodes(tx, 0) if f.params["aim"] == AIM_AGAIN else []
            open_ = await health_sql.open_episodes(tx)
            cordons = await health_sql.gpu_cordons(tx)
    except StoreError:
        return f
    excluded = {(str(r["node_id"]), str(r["gpu_uuid"])) for r in open_}
    excluded |= {
        (str(c["node_id"]), str(c["gpu_uuid"])) for c in cordons if c["quarantined"] or c["episode_id"] is None
    }
    if f.params["aim"] == AIM_HELD:
        return choose(f, [held(busy, now_ms)], excluded, rng)
    return choose(f, [ended(recent, "done"), ended(recent, "cleared")], excluded, rng)


__all__ = ["aim", "choose", "ended", "held"]
