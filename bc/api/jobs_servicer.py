"""The Admin API's job RPCs: submit, list, show, watch and cancel DAGs, and the slot pools.

A mixin of `AdminServicer` (which guards every RPC, `bc.api.admin_roles`): each body calls the job
engine (`bc.jobs.engine.JobEngine`, handed to the servicer by `bc serve`) or the job queries and maps
the views to messages (`bc.api.job_views`); errors leave through `abort_with`.

`CordonNode` is a one-node `cordon`/`uncordon` DAG too (`cordon_through_engine`): the reply is the
node once its DAG is terminal, as before. A node another live DAG names is refused Conflict before
anything is stored (its cordon would wait behind that DAG: `bc jobs run cordon N` waits its turn).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Protocol, TypeVar

import grpc

from bc.api import job_views
from bc.api.admin_roles import OTHERS_NEED
from bc.api.calls import AdminCalls
from bc.control.base import actor
from bc.control.base.bus import Bus
from bc.control.reads import queries as control_queries
from bc.errors import BcError, Conflict
from bc.jobs import queries
from bc.jobs.views import DagView, JobRequest
from bc.protocol.pb import admin_pb2
from bc.store import Store
from bc.wire.status import abort_with

T = TypeVar("T")

WATCH_BACKSTOP_WAKES = 10
"""WatchJob re-reads its DAG after this many quiet one-second waits even without a `job.*` event."""

CORDON_WAIT_S = 10.0
"""How long `CordonNode` waits for its DAG when another DAG took the node's lease in between."""


class JobEngine(Protocol):
    """What the API needs of `bc.jobs.engine.JobEngine`."""

    async def submit(self, req: JobRequest, requested_by: str) -> str: ...

    async def cancel(self, dag_id: str, requested_by: str) -> bool: ...

    async def set_slots(self, pool: str, capacity: int) -> None: ...


class JobRpcs(AdminCalls):
    """The job RPCs; `AdminServicer` provides the store, the bus, the engine and the call helpers."""

    store: Store
    bus: Bus
    jobs: JobEngine
    _caller: Callable[[grpc.aio.ServicerContext, str, str], Awaitable[actor.Caller]]  # the role guard's check

    async def SubmitJob(
        self, request: admin_pb2.SubmitJobRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.JobInfo:
        async def go(operator: str) -> admin_pb2.JobInfo:
            dag_id = await self.jobs.submit(job_views.job_request(request), operator)
            return job_views.job_info(await queries.get_dag(self.store, dag_id))

        return await self._call_as(context, go)

    async def ListJobs(
        self, request: admin_pb2.ListJobsRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.ListJobsResponse:
        async def go(_operator: str) -> admin_pb2.ListJobsResponse:
            snap = await queries.jobs_snapshot(self.store, include_all=request.include_all)
            infos, omitted = job_views.jobs_within(snap.dags)
            return admin_pb2.ListJobsResponse(
                jobs=infos, pools=[job_views.pool(p) for p in snap.pools], omitted=omitted, event_seq=snap.seq
            )

        return await self._call_as(context, go)

    async def GetJob(self, request: admin_pb2.GetJobRequest, context: grpc.aio.ServicerContext) -> admin_pb2.JobInfo:
        async def go(_operator: str) -> admin_pb2.JobInfo:
            return job_views.job_info(await queries.get_dag(self.store, request.dag_id))

        return await self._call_as(context, go)

    async def CancelJob(
        self, request: admin_pb2.CancelJobRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.CancelJobResponse:
        async def go(operator: str) -> admin_pb2.CancelJobResponse:
            owner = (await queries.get_dag(self.store, request.dag_id)).requested_by
            if owner != operator:
                need, what = OTHERS_NEED["CancelJob"]
                await self._caller(context, need, f"{what} ({request.dag_id} was run by {owner})")
            cancelled = await self.jobs.cancel(request.dag_id, operator)
            info = job_views.job_info(await queries.get_dag(self.store, request.dag_id))
            return admin_pb2.CancelJobResponse(cancelled=cancelled, job=info)

        return await self._call_as(context, go)

    async def JobSlots(
        self, request: admin_pb2.JobSlotsRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.JobSlotsResponse:
        async def go(_operator: str) -> admin_pb2.JobSlotsResponse:
            settings = job_views.slot_settings(dict(request.capacities), await queries.list_pools(self.store))
            for name, capacity in settings:
                await self.jobs.set_slots(name, capacity)
            return admin_pb2.JobSlotsResponse(pools=[job_views.pool(p) for p in await queries.list_pools(self.store)])

        return await self._call_as(context, go)

    async def WatchJob(
        self, request: admin_pb2.GetJobRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[admin_pb2.JobInfo]:
        """The DAG now, then again at each change (woken by its `job.*` events), ending once it is terminal."""
        try:
            async for view in self._dag_changes(request.dag_id):
                yield job_views.job_info(view)
        except BcError as e:
            await abort_with(context, e)

    async def _dag_changes(self, dag_id: str) -> AsyncIterator[DagView]:
        view = await queries.get_dag(self.store, dag_id)
        yield view
        after, quiet = view.seq, 0
        while not view.terminal:
            rows = await control_queries.events_after(self.store, after, "job.")
            if rows:
                after = max(after, rows[-1].seq)
            if any(r.subject == dag_id for r in rows) or quiet >= WATCH_BACKSTOP_WAKES:
                new = await queries.get_dag(self.store, dag_id)
                after, quiet = max(after, new.seq), 0
                if _changed(view, new):
                    yield new
                view = new
            elif len(rows) < control_queries.WATCH_PAGE:
                await self.bus.wait_events(1.0)
                quiet += 1

    # -- CordonNode: a one-node DAG -------------------------------------------------------------

    async def cordon_through_engine(self, node_id: str, cordon: bool, operator: str) -> None:
        """Cordon or uncordon `node_id` as a `cordon`/`uncordon` DAG; return once it is terminal and done."""
        template = "cordon" if cordon else "uncordon"
        request = job_views.job_request(admin_pb2.SubmitJobRequest(template=template, nodes=[node_id]))
        for dag in await queries.list_dags(self.store, include_all=False):
            if not dag.terminal and node_id in dag.subjects:
                raise Conflict(
                    f"node {node_id} is in job {dag.id} ({dag.template}, {dag.state}); `bc jobs run {template}"
                    f" {node_id}` waits for it, or cancel it with `bc jobs cancel {dag.id}`"
                )
        dag_id = await self.jobs.submit(request, operator)
        view = await self._settled(dag_id)
        if not view.terminal:
            raise Conflict(
                f"the {template} of {node_id} (job {dag_id}) waits for another job on the node;"
                f" it applies when that one ends: `bc jobs show {dag_id}`"
            )
        if view.state != "done":
            raise Conflict(
                f"the {template} of {node_id} (job {dag_id}) {view.state}: {view.first_error or 'no reason'}"
            )

    async def _settled(self, dag_id: str) -> DagView:
        """The DAG once terminal, or as it is after `CORDON_WAIT_S` of waiting."""
        loop_time = asyncio.get_running_loop().time
        deadline = loop_time() + CORDON_WAIT_S
        view = await queries.get_dag(self.store, dag_id)
        while not view.terminal and loop_time() < deadline:
            await self.bus.wait_events(min(1.0, max(0.0, deadline - loop_time())))
            view = await queries.get_dag(self.store, dag_id)
        return view


def _changed(old: DagView, new: DagView) -> bool:
    """Whether a client would see a difference (the read's event seq is not part of the document)."""
    return dataclasses.replace(new, seq=old.seq) != old
