"""The store's connectivity writes against the pure table (`bc.protocol.connectivity.apply`), on every driver.

Random event sequences go through the store functions the callers use (the Hello's `open_session`, the
epoch-fenced `close_session`, liveness' `mark_unreachable`, the tombstone, the revival), with the callers'
own guards (a deleted node's Hello is refused before it writes; only a live node is deleted). After each
step the node's row and routing read back exactly as the model says, and each write says whether it moved
the node as the table does.
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bc.protocol import connectivity as cx
from bc.store import Store, Tx
from bc.store import node_lifecycle as life_sql
from bc.store import nodes as nodes_sql
from tests.unit.protocol.test_connectivity_table import STEPS, Step

ROOT = Path(__file__).resolve().parents[3]
_NODE_IDS = itertools.count(1)


async def read(tx: Tx, node_id: str) -> cx.Connectivity:
    row = await nodes_sql.get(tx, node_id, include_deleted=True)
    assert row is not None
    since = row["connectivity_since_ms"]
    epoch = row["session_epoch"]
    return cx.Connectivity(
        state=str(row["connectivity"]),
        since_ms=None if since is None else int(since),
        reason=str(row["connectivity_reason"]),
        gateway_id=str(row["gateway_id"] or ""),
        epoch=0 if epoch is None else int(epoch),
        session_open=bool(row["session_open"]),
    )


async def write(tx: Tx, node_id: str, model: cx.Connectivity, step: Step, now_ms: int) -> bool | None:
    """The step through the store, as its caller writes it; what the write answered (None: it answers nothing)."""
    if step.event == cx.HELLO:
        await nodes_sql.open_session(
            tx,
            node_id=node_id,
            gateway_id=step.gateway_id,
            journal_id="j-1",
            boot_id="b-1",
            incarnation_id="i-1",
            cert_serial="01",
            now_ms=now_ms,
        )
        return None
    if step.event == cx.CLOSE:
        return await nodes_sql.close_session(tx, node_id, model.epoch - step.stale, now_ms, step.reason)
    if step.event == cx.GIVE_UP:
        return await nodes_sql.mark_unreachable(tx, node_id, now_ms)
    if step.event == cx.DELETE:
        await life_sql.tombstone(tx, node_id, now_ms)
        return None
    return await nodes_sql.revive(tx, node_id, now_ms)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(STEPS, max_size=25))
async def test_the_store_moves_a_node_as_the_table_says(store: Store, steps: list[Step]) -> None:
    node_id = f"n{next(_NODE_IDS)}"  # one store for every example: each walks a node of its own
    now_ms = 1_000
    async with store.transaction() as tx:
        await nodes_sql.ensure(tx, node_id, "node", now_ms)
        model = await read(tx, node_id)
    assert model == cx.Connectivity()
    for step in steps:
        now_ms += step.after_ms
        refused = (step.event == cx.HELLO and model.state == cx.DELETED) or (
            step.event == cx.DELETE and model.state not in cx.LIVE
        )
        if refused:
            continue
        expected = cx.apply(
            model, step.event, now_ms, gateway_id=step.gateway_id, epoch=model.epoch - step.stale, reason=step.reason
        )
        async with store.transaction() as tx:
            answered = await write(tx, node_id, model, step, now_ms)
            got = await read(tx, node_id)
            open_routes = await tx.fetchval(
                "SELECT COUNT(*) FROM node_sessions WHERE node_id = :n AND open = 1", {"n": node_id}
            )
        assert got == expected, step
        if answered is not None:  # a close, a give-up, a revival: True exactly when the state moved
            assert answered == (expected.state != model.state), step
        assert int(open_routes or 0) == int(expected.state == cx.CONNECTED)  # one open route, while connected
        model = expected


def test_no_product_code_writes_the_connectivity_columns_but_the_tables_sql() -> None:
    """Every write of the three columns is derived from the table in `bc/store/connectivity.py`; the one other
    (`nodes.set_connectivity`, a test's setup of a node in a given state) is called by no product module."""
    written = re.compile(r"connectivity(_since_ms|_reason)?\s*=\s*(?=['\w])(?!CASE)")
    offenders = []
    for path in sorted((ROOT / "bc").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        text = path.read_text(encoding="utf-8")
        if rel != "bc/store/nodes.py" and "set_connectivity(" in text:
            offenders.append(f"{rel}: calls set_connectivity")
        if rel.startswith("bc/store/") and rel != "bc/store/connectivity.py":
            offenders += [f"{rel}: {m.group(0)!r}" for m in written.finditer(text)]
    assert offenders == []
