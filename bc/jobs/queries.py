"""The reads every client of the job queue shares (the Admin API, so the CLI and the TUI): one function
each, one transaction each, returning `bc.jobs.views` documents with the event seq they read."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from bc.control.quorum import batches as quorum
from bc.errors import NotFound
from bc.jobs.views import ApprovalWait, DagView, NodeView, PoolView
from bc.store import Row, Store, Tx
from bc.store import events as events_sql
from bc.store import jobs as jobs_sql

KEEP_TERMINAL_PER_TEMPLATE = 5
"""The live list shows every running DAG and this many of the newest terminal ones per template."""


async def get_dag(store: Store, dag_id: str) -> DagView:
    now_ms = await store.now_ms()
    async with store.transaction(write=False) as tx:
        row = await jobs_sql.get_dag(tx, dag_id)
        if row is None:
            raise NotFound(f"no job named {dag_id!r}")
        return await _view(tx, row, await events_sql.last_seq(tx), now_ms)


async def list_dags(store: Store, *, include_all: bool = False) -> list[DagView]:
    """Live DAGs and the newest terminal ones per template (every DAG with `include_all`), oldest first."""
    now_ms = await store.now_ms()
    async with store.transaction(write=False) as tx:
        seq = await events_sql.last_seq(tx)
        rows = await jobs_sql.list_dag_rows(tx, include_all=include_all, keep_terminal=KEEP_TERMINAL_PER_TEMPLATE)
        return [await _view(tx, r, seq, now_ms) for r in rows]


async def list_pools(store: Store) -> list[PoolView]:
    async with store.transaction(write=False) as tx:
        return await _pools(tx)


@dataclass(frozen=True)
class JobsSnapshot:
    """The job list and the slot pools as one read, and the newest event seq of that read: a client that
    watches from `seq` sees every later change of them once (`bc.control.reads.queries` says why)."""

    dags: list[DagView]
    pools: list[PoolView]
    seq: int


async def jobs_snapshot(store: Store, *, include_all: bool = False) -> JobsSnapshot:
    """`list_dags` and `list_pools` in one transaction, with its seq (`ListJobs`)."""
    now_ms = await store.now_ms()
    async with store.transaction(write=False) as tx:
        seq = await events_sql.last_seq(tx)
        rows = await jobs_sql.list_dag_rows(tx, include_all=include_all, keep_terminal=KEEP_TERMINAL_PER_TEMPLATE)
        return JobsSnapshot([await _view(tx, r, seq, now_ms) for r in rows], await _pools(tx), seq)


async def _pools(tx: Tx) -> list[PoolView]:
    held = {str(r["pool_key"]): int(r["held"]) for r in await jobs_sql.held_slots(tx)}
    return [PoolView(str(p["name"]), int(p["capacity"]), held.get(str(p["name"]), 0)) for p in await jobs_sql.pools(tx)]


async def _view(tx: Tx, row: Row, seq: int, now_ms: int) -> DagView:
    dag_id = str(row["id"])
    deps: dict[str, list[tuple[str, str]]] = {}
    for e in await jobs_sql.edges_of(tx, dag_id):
        deps.setdefault(str(e["node_id"]), []).append((str(e["dep_id"]), str(e["kind"])))
    nodes = tuple(_node(n, deps.get(str(n["id"]), [])) for n in await jobs_sql.nodes_of(tx, dag_id))
    awaiting = await _awaiting_approval(tx, nodes, now_ms) if not row["settled_at_ms"] else ()
    return DagView(
        id=dag_id,
        template=str(row["template"]),
        state=str(row["state"]),
        terminal=row["settled_at_ms"] is not None,
        subjects=tuple(str(s) for s in json.loads(str(row["subjects"]))),
        args=_loads(row["args"]),
        requested_by=str(row["requested_by"]),
        reason=str(row["reason"]),
        first_error=str(row["first_error"] or ""),
        cancel_requested=bool(row["cancel_requested"]),
        created_at_ms=int(row["created_at_ms"]),
        settled_at_ms=int(row["settled_at_ms"] or 0),
        nodes=nodes,
        seq=seq,
        awaiting_approval=awaiting,
    )


async def _awaiting_approval(tx: Tx, nodes: tuple[NodeView, ...], now_ms: int) -> tuple[ApprovalWait, ...]:
    """The DAG's running Batch nodes whose batch still waits for its quorum, with the approvals that count."""
    out: list[ApprovalWait] = []
    for n in nodes:
        batch_id = str(n.detail.get("batch_id", ""))
        if n.kind != "Batch" or n.state != "running" or not batch_id:
            continue
        progress = await quorum.approval_progress(tx, batch_id, now_ms)
        if progress is not None:
            out.append(ApprovalWait(n.id, batch_id, *progress))
    return tuple(out)


def _node(r: Row, deps: list[tuple[str, str]]) -> NodeView:
    return NodeView(
        id=str(r["id"]),
        kind=str(r["kind"]),
        subject=str(r["subject"] or ""),
        state=str(r["state"]),
        error=str(r["error"] or ""),
        deps=tuple(deps),
        group=str(r["grp"] or ""),
        tail=bool(r["tail"]),
        detail=_loads(r["detail"]),
        started_at_ms=int(r["started_at_ms"] or 0),
        finished_at_ms=int(r["finished_at_ms"] or 0),
    )


def _loads(text: object) -> dict[str, Any]:
    value = json.loads(str(text or "{}"))
    return value if isinstance(value, dict) else {}
