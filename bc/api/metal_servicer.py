"""The Admin API's bare-metal RPCs (docs/metal.md): enroll, list, show and remove machines, and provision
them as one `metal.provision` job.

A mixin of `AdminServicer` (which guards every RPC, `bc.api.admin_roles`): enrolling and removing change a
site section's `machines[]` (root-equivalent: admin's, and the quorum's once approvers exist), provisioning
drives BMCs, wipes disks and installs an OS (admin's); listing and showing are a viewer's.
"""

from __future__ import annotations

import json
import random
from collections.abc import Awaitable, Callable

import grpc

from bc.api import admin_roles, job_views
from bc.api.calls import AdminCalls
from bc.api.jobs_servicer import JobEngine
from bc.control.base import actor
from bc.control.base.bus import Bus
from bc.control.metal import machines as metal_ctl
from bc.control.metal import plan as metal_plan
from bc.control.metal.views import MachineView
from bc.control.signing.signer import Signer
from bc.jobs import queries as job_queries
from bc.jobs.metal_template import TEMPLATE
from bc.jobs.views import JobRequest
from bc.protocol.pb import admin_pb2, metal_pb2
from bc.store import Store


def machine_info(m: MachineView) -> metal_pb2.MachineInfo:
    return metal_pb2.MachineInfo(
        name=m.name,
        site_node=m.site_node,
        bmc_url=m.bmc_url,
        system_id=m.system_id,
        macs=list(m.macs),
        labels=m.labels,
        state=m.state,
        step=m.step,
        reason=m.reason,
        node_id=m.node_id,
        dag_id=m.dag_id,
        enrolled_by=m.enrolled_by,
        created_at_ms=m.created_at_ms,
        updated_at_ms=m.updated_at_ms,
    )


def plan_request(r: metal_pb2.ProvisionMachinesRequest) -> metal_plan.Request:
    return metal_plan.Request(
        machines=tuple(r.machines),
        image=r.image,
        sha256=r.sha256,
        labels=tuple(r.labels),
        ramdisk_kernel_sha256=r.ramdisk_kernel_sha256,
        ramdisk_initrd_sha256=r.ramdisk_initrd_sha256,
        disk=r.disk,
        kexec_kernel=r.kexec_kernel,
        kexec_initrd=r.kexec_initrd,
        partition=r.partition,
        cmdline=r.cmdline,
        join_timeout_s=r.join_timeout_s,
        reprovision_node=r.reprovision_node,
    )


class MetalRpcs(AdminCalls):
    """`AdminServicer` provides the store, the bus, the signer, the Random, the job engine and the role check."""

    store: Store
    bus: Bus
    signer: Signer
    rng: random.Random
    jobs: JobEngine
    _caller: Callable[[grpc.aio.ServicerContext, str, str], Awaitable[actor.Caller]]

    async def EnrollMachine(
        self, request: metal_pb2.EnrollMachineRequest, context: grpc.aio.ServicerContext
    ) -> metal_pb2.EnrollMachineResponse:
        async def go() -> metal_pb2.EnrollMachineResponse:
            caller = await self._caller(context, *admin_roles.needed("EnrollMachine"))
            m, batch_id = await metal_ctl.enroll(
                self.store,
                self.bus,
                self.signer,
                self.rng,
                caller,
                name=request.name,
                site_node=request.site_node,
                bmc_url=request.bmc_url,
                system_id=request.system_id,
                macs=list(request.macs),
                labels=list(request.labels),
            )
            return metal_pb2.EnrollMachineResponse(machine=machine_info(m), pending_batch_id=batch_id)

        return await self._call(context, go)

    async def ListMachines(
        self, request: metal_pb2.ListMachinesRequest, context: grpc.aio.ServicerContext
    ) -> metal_pb2.ListMachinesResponse:
        async def go() -> metal_pb2.ListMachinesResponse:
            return metal_pb2.ListMachinesResponse(
                machines=[machine_info(m) for m in await metal_ctl.list_machines(self.store)]
            )

        return await self._call(context, go)

    async def GetMachine(
        self, request: metal_pb2.GetMachineRequest, context: grpc.aio.ServicerContext
    ) -> metal_pb2.MachineInfo:
        async def go() -> metal_pb2.MachineInfo:
            return machine_info(await metal_ctl.show(self.store, request.name))

        return await self._call(context, go)

    async def RemoveMachine(
        self, request: metal_pb2.RemoveMachineRequest, context: grpc.aio.ServicerContext
    ) -> metal_pb2.RemoveMachineResponse:
        async def go() -> metal_pb2.RemoveMachineResponse:
            caller = await self._caller(context, *admin_roles.needed("RemoveMachine"))
            batch_id = await metal_ctl.remove(self.store, self.bus, self.signer, self.rng, caller, request.name)
            return metal_pb2.RemoveMachineResponse(name=request.name, pending_batch_id=batch_id)

        return await self._call(context, go)

    async def ProvisionMachines(
        self, request: metal_pb2.ProvisionMachinesRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.JobInfo:
        async def go(operator: str) -> admin_pb2.JobInfo:
            plans = await metal_ctl.plans(self.store, plan_request(request))
            node = request.reprovision_node
            req = JobRequest(
                TEMPLATE,
                (node,) if node else tuple(p.machine for p in plans),
                reason=request.reason,
                max_parallel=request.max_parallel,
                metal_json=json.dumps([p.params() for p in plans], sort_keys=True),
                reprovision=node,
            )
            dag_id = await self.jobs.submit(req, operator)
            return job_views.job_info(await job_queries.get_dag(self.store, dag_id))

        return await self._call_as(context, go)
