"""The Admin API's health RPCs: `bc health` (GetHealth), `bc health policy show|set`, `bc health gpu
cordon|return` (docs/health.md).

A mixin of `AdminServicer` (which guards every RPC: `bc.api.admin_roles.ROLE_NEEDED` says who may call
each): a body calls one function of `bc.control` and returns its message.
"""

from __future__ import annotations

import random

import grpc

from bc.api.calls import AdminCalls
from bc.control.base.bus import Bus
from bc.control.health import admin as health_admin
from bc.control.health import gpus as health_gpus
from bc.control.reads import health as health_reads
from bc.protocol.pb import admin_pb2
from bc.store import Store


class HealthRpcs(AdminCalls):
    store: Store
    bus: Bus
    rng: random.Random

    async def GetHealth(
        self, request: admin_pb2.GetHealthRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.HealthInfo:
        return await self._call(context, lambda: health_reads.health(self.store))

    async def GetHealthPolicy(
        self, request: admin_pb2.GetHealthPolicyRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.HealthPolicyInfo:
        return await self._call(context, lambda: health_reads.health_policy(self.store))

    async def SetHealthPolicy(
        self, request: admin_pb2.SetHealthPolicyRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.HealthPolicyInfo:
        async def go(operator: str) -> admin_pb2.HealthPolicyInfo:
            await health_admin.set_policy(self.store, self.bus, request.policy_json, operator, request.reason, self.rng)
            return await health_reads.health_policy(self.store)

        return await self._call_as(context, go)

    async def CordonGpu(
        self, request: admin_pb2.CordonGpuRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.GpuCordonChange:
        return await self._call_as(
            context,
            lambda operator: health_gpus.cordon_gpu(
                self.store, self.bus, request.node_id, request.gpu, request.reason, operator
            ),
        )

    async def ReturnGpu(
        self, request: admin_pb2.ReturnGpuRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.GpuCordonChange:
        return await self._call_as(
            context,
            lambda operator: health_gpus.return_gpu(
                self.store, self.bus, request.node_id, request.gpu, request.reason, operator
            ),
        )
