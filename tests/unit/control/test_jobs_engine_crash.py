"""The persisted queue under crashes, as a Hypothesis model: random jobs over a small fleet, random
command outcomes, cancels, and a crash injected at a random write of a random step (the step's
transaction rolls back; a fresh engine with nothing in memory carries on, as a restarted `bc serve`).

After every action: no two live DAGs hold one node's lease, no pool over capacity, every Command node
sent at most one command, and no command belongs to a node that never started. At the end, with every
command settled, every DAG is terminal and nothing is held.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from bc.control.base.bus import Bus
from bc.control.signing.signer import NullSigner
from bc.errors import BcError
from bc.jobs import engine as engine_mod
from bc.jobs.engine import JobEngine
from bc.jobs.views import JobRequest
from bc.seams.clock import LoopClock
from bc.store import commands as cmd_sql
from bc.store import jobs as jobs_sql
from bc.store import nodes as nodes_sql
from bc.store.sqlite import InlineSqliteStore
from bc.testing import virtual_clock

NODES = ["n1", "n2", "n3"]


class Crash(Exception):
    """The process died here: the open transaction rolls back."""


jobs = st.one_of(
    st.builds(
        lambda nodes, par: JobRequest("reboot", tuple(nodes), max_parallel=par),
        st.lists(st.sampled_from(NODES), min_size=1, max_size=3, unique=True),
        st.integers(0, 2),
    ),
    st.builds(lambda n: JobRequest("cordon", (n,)), st.sampled_from(NODES)),
    st.builds(lambda n: JobRequest("uncordon", (n,)), st.sampled_from(NODES)),
    st.builds(lambda n: JobRequest("drain", (n,)), st.sampled_from(NODES)),
)
actions = st.lists(
    st.one_of(
        st.tuples(st.just("submit"), jobs),
        st.tuples(st.just("submit"), jobs),
        st.tuples(st.just("settle"), st.booleans()),  # settle one open command: succeeded or failed
        st.tuples(st.just("cancel"), st.integers(0, 5)),
        st.tuples(st.just("crash"), st.integers(1, 12)),  # the n-th node write of a later action's step dies
    ),
    min_size=1,
    max_size=14,
)


class Fleet:
    def __init__(self, store: InlineSqliteStore) -> None:
        self.store, self.bus = store, Bus()
        self.engine = self.fresh()
        self.crash_at = 0
        self.dags: list[str] = []

    def fresh(self) -> JobEngine:
        return JobEngine(self.store, self.bus, NullSigner(), random.Random(len(getattr(self, "dags", []))), holder="gw")

    async def guarded(self, call: Callable[[], Awaitable[Any]]) -> Any:
        try:
            return await call()
        except Crash:
            event("crashed mid-step")
            self.crash_at = 0
            self.engine = self.fresh()  # restart: nothing in memory survives
            return None
        except BcError:
            return None  # a refusal (a settled DAG cancelled twice, ...) changes nothing

    async def open_commands(self) -> list[dict[str, Any]]:
        async with self.store.transaction(write=False) as tx:
            return await tx.fetchall(
                "SELECT id, state FROM commands WHERE state IN ('pending', 'dispatched') ORDER BY id"
            )

    async def settle(self, ok: bool) -> None:
        open_ = await self.open_commands()
        if not open_:
            return
        c = open_[0]
        now_ms = await self.store.now_ms()
        async with self.store.transaction() as tx:
            await cmd_sql.settle(
                tx,
                str(c["id"]),
                expected=str(c["state"]),
                state="succeeded" if ok else "failed",
                reason="" if ok else "boom",
                message="",
                now_ms=now_ms,
            )

    async def check(self) -> None:
        async with self.store.transaction(write=False) as tx:
            live = {str(r["id"]) for r in await jobs_sql.live_dags(tx)}
            for lease in await jobs_sql.leases(tx):
                assert str(lease["dag_id"]) in live, f"a settled DAG still holds {lease['subject']}"
            caps = {str(p["name"]): int(p["capacity"]) for p in await jobs_sql.pools(tx)}
            for r in await jobs_sql.held_slots(tx):
                key = str(r["pool_key"])
                cap = caps.get(key)
                if cap is not None:
                    assert int(r["held"]) <= cap, f"pool {key} over capacity"
            rows = await tx.fetchall(
                "SELECT idempotency_key, COUNT(*) AS n FROM commands WHERE idempotency_key LIKE 'job:%'"
                " GROUP BY idempotency_key"
            )
            for r in rows:
                assert int(r["n"]) == 1, f"{r['idempotency_key']} sent {r['n']} times"
                _, dag_id, node_id = str(r["idempotency_key"]).split(":", 2)
                node = await jobs_sql.node(tx, dag_id, node_id)
                assert node is not None and str(node["state"]) != "queued", f"{node_id} sent before it started"


async def run(tmp_path: Path, clock: LoopClock, steps: list[tuple[str, Any]], monkeypatch: pytest.MonkeyPatch) -> None:
    store = InlineSqliteStore(tmp_path / "crash.db", clock)
    await store.open()
    try:
        async with store.transaction() as tx:
            for n in NODES:
                await nodes_sql.ensure(tx, n, "node", 0)
                await nodes_sql.set_connectivity(tx, n, "connected", 0)
        fleet = Fleet(store)
        writes = {"n": 0}
        real = jobs_sql.set_node_state

        async def counting(*a: Any, **kw: Any) -> None:
            writes["n"] += 1
            if fleet.crash_at and writes["n"] >= fleet.crash_at:
                raise Crash()
            await real(*a, **kw)

        monkeypatch.setattr(engine_mod.jobs_sql, "set_node_state", counting)
        for kind, arg in steps:
            writes["n"] = 0
            if kind == "crash":
                fleet.crash_at = int(arg)  # armed until a step writes that many node states
            elif kind == "submit":
                dag_id = await fleet.guarded(lambda a=arg: fleet.engine.submit(a, "alice"))
                if dag_id:
                    fleet.dags.append(dag_id)
            elif kind == "settle":
                await fleet.settle(bool(arg))
                await fleet.guarded(fleet.engine.pass_once)
            elif kind == "cancel" and fleet.dags:
                d = fleet.dags[int(arg) % len(fleet.dags)]
                await fleet.guarded(lambda d=d: fleet.engine.cancel(d, "alice"))
            await fleet.check()
        for _ in range(100):  # drive to the end: the engine notices, every command it sends settles
            moved = await fleet.guarded(fleet.engine.pass_once)
            if moved == 0 and not await fleet.open_commands():  # None: that pass crashed, so look again
                break
            await fleet.settle(True)
            await fleet.check()
        async with store.transaction(write=False) as tx:
            sent = int(await tx.fetchval("SELECT COUNT(*) FROM commands") or 0)
            event(f"dags={min(len(fleet.dags), 3)}+ commands={min(sent, 3)}+")
            assert await jobs_sql.live_dags(tx) == [], "a DAG never settled"
            assert await jobs_sql.leases(tx) == []
            assert await tx.fetchval("SELECT COUNT(*) FROM job_slots") == 0
            assert await tx.fetchval("SELECT COUNT(*) FROM nodes WHERE job_hold IS NOT NULL") == 0
    finally:
        await store.close()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=actions)
def test_crashes_at_any_write_never_send_twice_and_every_dag_settles(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch, steps: list[tuple[str, Any]]
) -> None:
    from bc.seams.virtual_time import run as run_virtual

    tmp = tmp_path_factory.mktemp("crash")
    with monkeypatch.context() as m:
        run_virtual(run(tmp, virtual_clock(), steps, m))
