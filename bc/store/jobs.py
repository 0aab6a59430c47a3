"""The job queue's rows: DAGs, nodes, edges, held leases and slots, pool capacities (docs/jobs.md)."""

from __future__ import annotations

from bc.store.base import Row, Tx

# -- the step's lock and version -------------------------------------------------


async def bump_version(tx: Tx) -> int:
    """Take the scheduler's row lock (PostgreSQL) and return the new version; the old one is this minus 1."""
    await tx.execute("UPDATE job_meta SET version = version + 1 WHERE id = 1")
    return int(await tx.fetchval("SELECT version FROM job_meta WHERE id = 1") or 0)


async def version(tx: Tx) -> int:
    return int(await tx.fetchval("SELECT version FROM job_meta WHERE id = 1") or 0)


# -- loading the live world --------------------------------------------------------


async def live_dags(tx: Tx) -> list[Row]:
    return await tx.fetchall("SELECT * FROM job_dags WHERE settled_at_ms IS NULL ORDER BY submit_seq")


async def live_nodes(tx: Tx) -> list[Row]:
    return await tx.fetchall(
        "SELECT n.* FROM job_nodes n JOIN job_dags d ON d.id = n.dag_id"
        " WHERE d.settled_at_ms IS NULL ORDER BY n.dag_id, n.pos"
    )


async def live_edges(tx: Tx) -> list[Row]:
    return await tx.fetchall(
        "SELECT e.* FROM job_edges e JOIN job_dags d ON d.id = e.dag_id"
        " WHERE d.settled_at_ms IS NULL ORDER BY e.dag_id, e.node_id, e.dep_id"
    )


async def leases(tx: Tx) -> list[Row]:
    return await tx.fetchall("SELECT subject, dag_id FROM job_leases ORDER BY subject")


async def slots(tx: Tx) -> list[Row]:
    return await tx.fetchall("SELECT pool_key, dag_id, node_id FROM job_slots ORDER BY pool_key, dag_id, node_id")


async def pools(tx: Tx) -> list[Row]:
    return await tx.fetchall("SELECT name, capacity FROM job_pools ORDER BY name")


# -- writing a step ------------------------------------------------------------------


async def next_submit_seq(tx: Tx) -> int:
    return int(await tx.fetchval("SELECT COALESCE(MAX(submit_seq), 0) + 1 FROM job_dags") or 1)


async def dag_exists(tx: Tx, dag_id: str) -> bool:
    return await tx.fetchval("SELECT 1 FROM job_dags WHERE id = :d", {"d": dag_id}) is not None


async def insert_dag(
    tx: Tx,
    *,
    id_: str,
    submit_seq: int,
    template: str,
    args: str,
    subjects: str,
    local_pools: str,
    stop_on_failure: bool,
    requested_by: str,
    reason: str,
    now_ms: int,
) -> None:
    await tx.execute(
        "INSERT INTO job_dags (id, submit_seq, template, args, subjects, local_pools, stop_on_failure, state,"
        " requested_by, reason, created_at_ms)"
        " VALUES (:id, :seq, :t, :a, :s, :lp, :sof, 'queued', :rb, :r, :now)",
        {
            "id": id_,
            "seq": submit_seq,
            "t": template,
            "a": args,
            "s": subjects,
            "lp": local_pools,
            "sof": int(stop_on_failure),
            "rb": requested_by,
            "r": reason,
            "now": now_ms,
        },
    )


async def insert_node(
    tx: Tx,
    *,
    dag_id: str,
    id_: str,
    pos: int,
    kind: str,
    subject: str | None,
    params: str,
    lease: bool,
    pools: str,
    group: str | None,
    tail: bool,
) -> None:
    await tx.execute(
        "INSERT INTO job_nodes (dag_id, id, pos, kind, subject, params, lease, pools, grp, tail, state)"
        " VALUES (:d, :id, :pos, :k, :s, :p, :l, :pl, :g, :t, 'queued')",
        {
            "d": dag_id,
            "id": id_,
            "pos": pos,
            "k": kind,
            "s": subject,
            "p": params,
            "l": int(lease),
            "pl": pools,
            "g": group,
            "t": int(tail),
        },
    )


async def insert_edge(tx: Tx, dag_id: str, node_id: str, dep_id: str, kind: str) -> None:
    await tx.execute(
        "INSERT INTO job_edges (dag_id, node_id, dep_id, kind) VALUES (:d, :n, :dep, :k)",
        {"d": dag_id, "n": node_id, "dep": dep_id, "k": kind},
    )


async def max_pos(tx: Tx, dag_id: str) -> int:
    return int(await tx.fetchval("SELECT COALESCE(MAX(pos), -1) FROM job_nodes WHERE dag_id = :d", {"d": dag_id}))


async def set_node_state(
    tx: Tx, dag_id: str, node_id: str, state: str, now_ms: int, *, error: str | None = None
) -> None:
    started = ", started_at_ms = :now" if state == "running" else ""
    finished = ", finished_at_ms = :now" if state in ("done", "failed", "cancelled") else ""
    await tx.execute(
        f"UPDATE job_nodes SET state = :s, error = COALESCE(:e, error){started}{finished}"
        " WHERE dag_id = :d AND id = :n",
        {"s": state, "e": error, "now": now_ms, "d": dag_id, "n": node_id},
    )


async def set_node_detail(tx: Tx, dag_id: str, node_id: str, detail: str) -> None:
    await tx.execute(
        "UPDATE job_nodes SET detail = :x WHERE dag_id = :d AND id = :n", {"x": detail, "d": dag_id, "n": node_id}
    )


async def node(tx: Tx, dag_id: str, node_id: str) -> Row | None:
    return await tx.fetchone("SELECT * FROM job_nodes WHERE dag_id = :d AND id = :n", {"d": dag_id, "n": node_id})


_SETTLED = frozenset({"succeeded", "failed", "rejected", "cancelled", "expired", "gone"})


async def settled_commands(tx: Tx, command_ids: list[str]) -> set[str]:
    """Which of these commands have settled (or are gone: a deleted command ends its node too)."""
    out: set[str] = set()
    for i in range(0, len(command_ids), 500):  # bounded IN lists: SQLite's variable limit, PostgreSQL's plan
        chunk = command_ids[i : i + 500]
        names = {f"c{j}": c for j, c in enumerate(chunk)}
        rows = await tx.fetchall(
            f"SELECT id, state FROM commands WHERE id IN ({', '.join(':' + k for k in names)})", names
        )
        states = {str(r["id"]): str(r["state"]) for r in rows}
        out |= {c for c in chunk if states.get(c, "gone") in _SETTLED}
    return out


async def any_running(tx: Tx) -> bool:
    """Whether any job node runs (`job_nodes_running`'s first entry): what a pass woken by an event checks."""
    return await tx.fetchval("SELECT 1 FROM job_nodes WHERE state = 'running' LIMIT 1") is not None


async def running_nodes(tx: Tx) -> list[Row]:
    return await tx.fetchall("SELECT * FROM job_nodes WHERE state = 'running' ORDER BY dag_id, pos")


async def update_dag(
    tx: Tx,
    dag_id: str,
    *,
    state: str,
    first_error: str | None,
    cancel_requested: bool,
    settled_at_ms: int | None,
) -> None:
    await tx.execute(
        "UPDATE job_dags SET state = :s, first_error = COALESCE(first_error, :e),"
        " cancel_requested = :c, settled_at_ms = :t WHERE id = :d",
        {"s": state, "e": first_error, "c": int(cancel_requested), "t": settled_at_ms, "d": dag_id},
    )


async def take_lease(tx: Tx, subject: str, dag_id: str) -> None:
    await tx.execute("INSERT INTO job_leases (subject, dag_id) VALUES (:s, :d)", {"s": subject, "d": dag_id})


async def drop_lease(tx: Tx, subject: str, dag_id: str) -> None:
    await tx.execute("DELETE FROM job_leases WHERE subject = :s AND dag_id = :d", {"s": subject, "d": dag_id})


async def take_slot(tx: Tx, pool_key: str, dag_id: str, node_id: str) -> None:
    await tx.execute(
        "INSERT INTO job_slots (pool_key, dag_id, node_id) VALUES (:k, :d, :n)",
        {"k": pool_key, "d": dag_id, "n": node_id},
    )


async def drop_slot(tx: Tx, pool_key: str, dag_id: str, node_id: str) -> None:
    await tx.execute(
        "DELETE FROM job_slots WHERE pool_key = :k AND dag_id = :d AND node_id = :n",
        {"k": pool_key, "d": dag_id, "n": node_id},
    )


async def drop_dag_slots(tx: Tx, dag_id: str) -> None:
    await tx.execute("DELETE FROM job_slots WHERE dag_id = :d", {"d": dag_id})


async def set_pool(tx: Tx, name: str, capacity: int) -> None:
    await tx.execute(
        "INSERT INTO job_pools (name, capacity) VALUES (:n, :c) ON CONFLICT (name) DO UPDATE SET capacity = :c",
        {"n": name, "c": capacity},
    )


async def held_slots(tx: Tx) -> list[Row]:
    return await tx.fetchall("SELECT pool_key, COUNT(*) AS held FROM job_slots GROUP BY pool_key")


# -- reads for the views ----------------------------------------------------------------


async def get_dag(tx: Tx, dag_id: str) -> Row | None:
    return await tx.fetchone("SELECT * FROM job_dags WHERE id = :d", {"d": dag_id})


async def nodes_of(tx: Tx, dag_id: str) -> list[Row]:
    return await tx.fetchall("SELECT * FROM job_nodes WHERE dag_id = :d ORDER BY pos", {"d": dag_id})


async def edges_of(tx: Tx, dag_id: str) -> list[Row]:
    return await tx.fetchall(
        "SELECT node_id, dep_id, kind FROM job_edges WHERE dag_id = :d ORDER BY node_id, dep_id", {"d": dag_id}
    )


async def list_dag_rows(tx: Tx, *, include_all: bool, keep_terminal: int) -> list[Row]:
    """Live DAGs and the `keep_terminal` newest terminal ones per template (every DAG with include_all)."""
    if include_all:
        return await tx.fetchall("SELECT * FROM job_dags ORDER BY submit_seq")
    return await tx.fetchall(
        "SELECT * FROM job_dags d WHERE d.settled_at_ms IS NULL OR"
        " (SELECT COUNT(*) FROM job_dags n WHERE n.template = d.template AND n.settled_at_ms IS NOT NULL"
        "  AND n.submit_seq > d.submit_seq) < :k"
        " ORDER BY d.submit_seq",
        {"k": keep_terminal},
    )


# -- the node's job hold (a job's transient cordon) ----------------------------------------


async def set_job_hold(tx: Tx, node_id: str, dag_id: str) -> None:
    await tx.execute("UPDATE nodes SET job_hold = :d WHERE node_id = :n", {"d": dag_id, "n": node_id})


async def clear_job_hold(tx: Tx, node_id: str, dag_id: str) -> bool:
    n = await tx.execute(
        "UPDATE nodes SET job_hold = NULL WHERE node_id = :n AND job_hold = :d", {"d": dag_id, "n": node_id}
    )
    return n == 1


async def live_reservations(tx: Tx, node_id: str) -> list[Row]:
    """The node's live reservations (id, tenant, end_ms: its booked interval's end, else its asked end; NULL:
    open-ended), in id order: what a drain waits for."""
    return await tx.fetchall(
        "SELECT r.id, r.tenant, COALESCE((SELECT CASE WHEN COUNT(*) > 0 AND COUNT(*) = COUNT(b.end_ms)"
        " THEN MAX(b.end_ms) END FROM device_bookings b WHERE b.reservation_id = r.id AND b.node_id = r.node_id),"
        " r.end_ms) AS end_ms FROM reservations r WHERE r.node_id = :n"
        " AND r.state NOT IN ('released', 'failed', 'ended', 'lost') ORDER BY r.id",
        {"n": node_id},
    )


async def existing_nodes(tx: Tx, node_ids: list[str]) -> set[str]:
    if not node_ids:
        return set()
    names = {f"n{i}": n for i, n in enumerate(node_ids)}
    rows = await tx.fetchall(
        f"SELECT node_id FROM nodes WHERE node_id IN ({', '.join(':' + k for k in names)}) AND deleted_at_ms IS NULL",
        names,
    )
    return {str(r["node_id"]) for r in rows}
