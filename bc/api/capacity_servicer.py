"""The Admin API's capacity RPCs: a reservation shown, why it waits, and usage (docs/capacity.md).

A mixin of `AdminServicer` (which guards every RPC, `bc.api.admin_roles`), like `bc.api.jobs_servicer`:
each body calls a read of `bc.control.reads.queries` and maps its answer to messages; errors leave through
`abort_with`. `reserve_request` maps the wire's ReserveRequest to the control plane's (0: unset).
"""

from __future__ import annotations

from typing import TypeVar

import grpc

from bc.api.calls import AdminCalls
from bc.control.capacity import reservations
from bc.control.reads import queries
from bc.protocol.pb import admin_pb2
from bc.store import Store

T = TypeVar("T")


def reserve_request(request: admin_pb2.ReserveRequest) -> reservations.ReserveRequest:
    return reservations.ReserveRequest(
        gpus=request.gpus,
        node_id=request.node_id,
        device_class=request.device_class or "gpu",
        binding=request.binding or "hold",
        start_ms=request.start_ms or None,
        end_ms=request.end_ms or None,
        duration_ms=request.duration_ms or None,
        cpus=request.cpus,
        memory_bytes=request.memory_bytes,
        hugepages_1g=request.hugepages_1g,
        tenant=request.tenant,
        selector=dict(request.selector),
    )


class CapacityRpcs(AdminCalls):
    """The capacity RPCs; `AdminServicer` provides the store and the call helpers."""

    store: Store

    async def GetReservation(
        self, request: admin_pb2.GetReservationRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.Reservation:
        return await self._call(context, lambda: queries.reservation(self.store, request.reservation_id))

    async def GetPlacementExplanation(
        self, request: admin_pb2.GetReservationRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.PlacementExplanation:
        async def go() -> admin_pb2.PlacementExplanation:
            e = await queries.explain(self.store, request.reservation_id)
            return admin_pb2.PlacementExplanation(
                reservation_id=e.reservation_id,
                state=e.state,
                reason=e.reason,
                earliest_start_ms=e.earliest_start_ms or 0,
                held_node_id=e.held_node_id,
                queue_position=e.queue_position,
            )

        return await self._call(context, go)

    async def GetUsage(
        self, request: admin_pb2.UsageRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.UsageResponse:
        async def go() -> admin_pb2.UsageResponse:
            rows, now_ms = await queries.usage(
                self.store, request.since_ms or None, request.until_ms or None, request.by
            )
            return admin_pb2.UsageResponse(
                rows=[
                    admin_pb2.UsageRow(
                        key=r.key,
                        atom_ms=r.atom_ms,
                        atom_seconds=r.atom_seconds,
                        windows=r.windows,
                        device_class=r.device_class,
                        profile=r.profile,
                    )
                    for r in rows
                ],
                now_ms=now_ms,
            )

        return await self._call(context, go)
