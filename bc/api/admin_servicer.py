"""The Admin service: everything an operator does, behind an operator certificate and a role.

Every RPC of the service goes through the guard of `bc.api.admin_roles`
(`guarded`): the caller must be a live operator whose role is at least the
one `ROLE_NEEDED` names, and the body then runs acting for that operator.

Its dependencies come in through the constructor, built once by `bc serve`:
the `Signer` that signs the commands and specs it writes, the process's one
Random for the ids it makes, the `Secrets` that join-token secrets and a
rotated worker key are drawn from, and the job engine (`jobs`) that the job
RPCs (`bc.api.jobs_servicer`) and `CordonNode` submit to.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from typing import TypeVar

import grpc

from bc import __version__
from bc.api.admin_roles import guarded
from bc.api.capacity_servicer import CapacityRpcs, reserve_request
from bc.api.jobs_servicer import JobEngine, JobRpcs
from bc.api.peers import operator_of
from bc.clock import Clock
from bc.control import approvers, commands, identity, node_admin, operators, quorum, reservations, specs, views
from bc.control import intent as intent_ctl
from bc.control.bus import Bus
from bc.control.signer import Signer
from bc.errors import NotFound, UsageError
from bc.pki.ca import CertificateAuthority
from bc.pki.secrets_source import Secrets
from bc.protocol.limits import LIMITS
from bc.protocol.pb import admin_pb2
from bc.store import Row, Store
from bc.store import capacity as cap_sql
from bc.store import events as events_sql
from bc.store import nodes as nodes_sql
from bc.store import operators as ops_sql
from bc.store import quorum as q_sql
from bc.store import reservations as res_sql
from bc.store import revocation as rev_sql
from bc.wire.stubs import admin_pb2_grpc

MAX_EVENTS_LIMIT = 10_000
T = TypeVar("T")


@guarded
class AdminServicer(JobRpcs, CapacityRpcs, admin_pb2_grpc.AdminServicer):
    def __init__(
        self,
        store: Store,
        bus: Bus,
        ca: CertificateAuthority,
        clock: Clock,
        gateway_id: str,
        *,
        signer: Signer,
        rng: random.Random,
        secrets: Secrets,
        jobs: JobEngine,
    ) -> None:
        self.store, self.bus, self.ca, self.clock, self.gateway_id = store, bus, ca, clock, gateway_id
        self.signer, self.rng, self.secrets, self.jobs = signer, rng, secrets, jobs

    async def _caller(self, context: grpc.aio.ServicerContext, need: str, what: str) -> operators.Caller:
        return await operators.authorize(self.store, operator_of(context, self.ca.certificate), need, what)

    async def CreateToken(
        self, request: admin_pb2.CreateTokenRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.CreateTokenResponse:
        async def go() -> admin_pb2.CreateTokenResponse:
            t = await identity.create_token(
                self.store,
                self.bus,
                self.ca,
                self.clock,
                request.node_id,
                request.role or "node",
                float(request.ttl_s or 3600),
                rng=self.rng,
                secrets=self.secrets,
            )
            return admin_pb2.CreateTokenResponse(
                token=t.token, token_id=t.token_id, node_id=t.node_id, expires_at_ms=t.expires_at_ms
            )

        return await self._call(context, go)

    async def ListNodes(
        self, request: admin_pb2.ListNodesRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.ListNodesResponse:
        async def go() -> admin_pb2.ListNodesResponse:
            now_ms = await self.store.now_ms()
            async with self.store.transaction(write=False) as tx:
                rows = await nodes_sql.list_all(tx, include_deleted=request.include_deleted)
                certs = await rev_sql.cert_states(tx)
            return admin_pb2.ListNodesResponse(
                nodes=[views.node_info(r, now_ms, detail=False, certs=certs.get(str(r["node_id"]))) for r in rows]
            )

        return await self._call(context, go)

    async def GetNode(self, request: admin_pb2.GetNodeRequest, context: grpc.aio.ServicerContext) -> admin_pb2.NodeInfo:
        async def go() -> admin_pb2.NodeInfo:
            now_ms = await self.store.now_ms()
            async with self.store.transaction(write=False) as tx:
                # A deleted node still shows (state "deleted"): its history is kept.
                row = await nodes_sql.get(tx, request.node_id, include_deleted=True)
                certs = await rev_sql.cert_states(tx)
                bookings = await cap_sql.live_bookings_on(tx, request.node_id)
            if row is None:
                raise NotFound(f"no node named {request.node_id!r}")
            info = views.node_info(row, now_ms, detail=True, certs=certs.get(request.node_id))
            views.add_capacity(info, bookings, now_ms)
            return info

        return await self._call(context, go)

    async def _spec_info(self, node_id: str) -> admin_pb2.SpecInfo:
        async with self.store.transaction(write=False) as tx:
            row = await nodes_sql.get(tx, node_id)
        if row is None:
            raise NotFound(f"no node named {node_id!r}")
        return admin_pb2.SpecInfo(
            node_id=node_id,
            generation=int(row["generation"]),
            spec_hash=str(row["spec_hash"]),
            spec_json=str(row["spec"]),
        )

    async def GetSpec(self, request: admin_pb2.GetNodeRequest, context: grpc.aio.ServicerContext) -> admin_pb2.SpecInfo:
        return await self._call(context, lambda: self._spec_info(request.node_id))

    async def SetSpecSection(
        self, request: admin_pb2.SetSpecSectionRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.SpecInfo:
        async def go() -> admin_pb2.SpecInfo:
            await specs.set_section(
                self.store, self.bus, self.signer, request.node_id, request.section, request.section_json or "{}"
            )
            return await self._spec_info(request.node_id)

        return await self._call(context, go)

    async def _reservation(self, rid: str) -> admin_pb2.Reservation:
        now_ms = await self.store.now_ms()
        async with self.store.transaction(write=False) as tx:
            row = await res_sql.get(tx, rid)
            if row is None:
                raise NotFound(f"no reservation named {rid!r}")
            return views.reservation(row, await res_sql.bookings(tx, rid), now_ms)

    async def Reserve(
        self, request: admin_pb2.ReserveRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.Reservation:
        async def go() -> admin_pb2.Reservation:
            row = await reservations.reserve(
                self.store,
                self.bus,
                self.signer,
                reserve_request(request),
                self.rng,
            )
            return await self._reservation(str(row["id"]))

        return await self._call(context, go)

    async def Release(
        self, request: admin_pb2.ReleaseRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.Reservation:
        async def go() -> admin_pb2.Reservation:
            row = await reservations.release(self.store, self.bus, self.signer, request.reservation_id)
            return await self._reservation(str(row["id"]))

        return await self._call(context, go)

    async def ListReservations(
        self, request: admin_pb2.ListReservationsRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.ListReservationsResponse:
        async def go() -> admin_pb2.ListReservationsResponse:
            now_ms = await self.store.now_ms()
            out = admin_pb2.ListReservationsResponse()
            async with self.store.transaction(write=False) as tx:
                rows = await res_sql.list_(
                    tx, request.node_id, request.include_released, state=request.state, tenant=request.tenant
                )
                for row in rows:
                    out.reservations.append(views.reservation(row, await res_sql.bookings(tx, str(row["id"])), now_ms))
            return out

        return await self._call(context, go)

    async def ListEvents(
        self, request: admin_pb2.ListEventsRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.ListEventsResponse:
        async def go() -> admin_pb2.ListEventsResponse:
            if not 0 <= request.limit <= MAX_EVENTS_LIMIT:
                raise UsageError(f"the limit must be between 0 and {MAX_EVENTS_LIMIT:,}, not {request.limit}")
            async with self.store.transaction(write=False) as tx:
                rows = await events_sql.list_events(tx, request.after_seq, request.limit or 1000, request.type_prefix)
            records = views.events_within([views.event_record(r) for r in rows], LIMITS.max_frame_bytes)
            return admin_pb2.ListEventsResponse(events=records)

        return await self._call(context, go)

    async def Watch(
        self, request: admin_pb2.WatchRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[admin_pb2.EventRecord]:
        after = request.after_seq
        while True:
            async with self.store.transaction(write=False) as tx:
                rows = await events_sql.list_events(tx, after, 500, request.type_prefix)
            for r in rows:
                after = int(r["seq"])
                yield views.event_record(r)
            if not rows:
                await self.bus.wait_events(1.0)

    async def ServerInfo(
        self, request: admin_pb2.ServerInfoRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.ServerInfoResponse:
        async def go(operator: str) -> admin_pb2.ServerInfoResponse:
            async with self.store.transaction(write=False) as tx:
                row = await ops_sql.get(tx, operator)
                seq = await events_sql.last_seq(tx)
            return admin_pb2.ServerInfoResponse(
                version=__version__,
                ca_fingerprint=self.ca.fingerprint,
                server_time_ms=await self.store.now_ms(),
                store=self.store.description,
                gateway_id=self.gateway_id,
                operator=operator,
                role=str(row["role"]) if row else "",
                event_seq=seq,
            )

        return await self._call_as(context, go)

    # -- commands ------------------------------------------------------------------

    async def _command_info(self, row: Row) -> admin_pb2.CommandInfo:
        return views.command_info(row, await self.store.now_ms())

    async def RunCommand(
        self, request: admin_pb2.RunCommandRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.CommandInfo:
        async def go(operator: str) -> admin_pb2.CommandInfo:
            commands.kind_of(request.kind)  # an unknown kind is the clearer error than its payload's
            payload = commands.payload_from_json(request.kind, request.payload_json)
            row = await commands.enqueue(
                self.store,
                self.bus,
                self.signer,
                commands.EnqueueRequest(
                    node_id=request.node_id,
                    kind=request.kind,
                    payload=payload,
                    not_after_s=float(request.not_after_s or commands.DEFAULT_NOT_AFTER_S),
                    min_generation=request.min_generation,
                    idempotency_key=request.idempotency_key,
                    requested_by=operator,
                ),
                self.rng,
            )
            return await self._command_info(row)

        return await self._call_as(context, go)

    async def GetCommand(
        self, request: admin_pb2.GetCommandRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.CommandInfo:
        async def go() -> admin_pb2.CommandInfo:
            return await self._command_info(await commands.get(self.store, request.command_id))

        return await self._call(context, go)

    async def ListCommands(
        self, request: admin_pb2.ListCommandsRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.ListCommandsResponse:
        async def go() -> admin_pb2.ListCommandsResponse:
            rows = await commands.list_commands(
                self.store, node_id=request.node_id, state=request.state, limit=request.limit
            )
            now_ms = await self.store.now_ms()
            infos = views.fit_command_results([views.command_info(r, now_ms) for r in rows], LIMITS.max_frame_bytes)
            return admin_pb2.ListCommandsResponse(commands=infos)

        return await self._call(context, go)

    async def CancelCommand(
        self, request: admin_pb2.CancelCommandRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.CommandInfo:
        async def go() -> admin_pb2.CommandInfo:
            row = await commands.request_cancel(self.store, self.bus, request.command_id, request.reason)
            return await self._command_info(row)

        return await self._call(context, go)

    # -- node lifecycle and PKI ------------------------------------------------------

    async def _node_info(self, node_id: str) -> admin_pb2.NodeInfo:
        now_ms = await self.store.now_ms()
        async with self.store.transaction(write=False) as tx:
            row = await nodes_sql.get(tx, node_id)
            certs = await rev_sql.cert_states(tx)
        if row is None:
            raise NotFound(f"no node named {node_id!r}")
        return views.node_info(row, now_ms, detail=False, certs=certs.get(node_id))

    async def RevokeNode(
        self, request: admin_pb2.RevokeNodeRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.NodeInfo:
        async def go() -> admin_pb2.NodeInfo:
            await node_admin.revoke(self.store, self.bus, request.node_id, request.reason)
            return await self._node_info(request.node_id)

        return await self._call(context, go)

    async def CordonNode(
        self, request: admin_pb2.CordonNodeRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.NodeInfo:
        async def go(operator: str) -> admin_pb2.NodeInfo:
            await self.cordon_through_engine(request.node_id, request.cordon, operator)
            return await self._node_info(request.node_id)

        return await self._call_as(context, go)

    async def LabelNode(
        self, request: admin_pb2.LabelNodeRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.NodeInfo:
        async def go() -> admin_pb2.NodeInfo:
            await node_admin.label(self.store, self.bus, request.node_id, dict(request.set), list(request.remove))
            return await self._node_info(request.node_id)

        return await self._call(context, go)

    async def DeleteNode(
        self, request: admin_pb2.GetNodeRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.DeleteNodeResponse:
        async def go() -> admin_pb2.DeleteNodeResponse:
            serials = await node_admin.delete(self.store, self.bus, request.node_id)
            return admin_pb2.DeleteNodeResponse(node_id=request.node_id, revoked_certificates=len(serials))

        return await self._call(context, go)

    def _pki_info(self) -> admin_pb2.PkiInfo:
        keys = self.signer.keys
        info = admin_pb2.PkiInfo(
            ca_fingerprint=self.ca.fingerprint,
            ca_not_after_ms=int(self.ca.certificate.not_valid_after_utc.timestamp() * 1000),
            command_signing=keys is not None,
            attested_bindings=self.signer.attested,
        )
        if keys is not None:
            root, worker = keys.root, keys.worker
            info.roots.append(views.signing_key_info(root))
            info.worker.CopyFrom(views.signing_key_info(worker.cert))
        return info

    async def GetPki(self, request: admin_pb2.GetPkiRequest, context: grpc.aio.ServicerContext) -> admin_pb2.PkiInfo:
        async def go() -> admin_pb2.PkiInfo:
            return self._pki_info()

        return await self._call(context, go)

    async def RotateSigningKey(
        self, request: admin_pb2.GetPkiRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.PkiInfo:
        async def go() -> admin_pb2.PkiInfo:
            specs_n, cmds_n = await intent_ctl.rotate(
                self.store, self.bus, self.signer, self.clock, self.rng, self.secrets
            )
            info = self._pki_info()
            info.resigned_specs, info.resigned_commands = specs_n, cmds_n
            return info

        return await self._call(context, go)

    # -- the quorum settings and their changes ---------------------------------------------

    async def _approver_set(self, proposed: approvers.Proposed | None = None) -> admin_pb2.ApproverSet:
        current = await approvers.approver_set(self.store)
        out = approvers.set_info(current, await self.store.now_ms())
        if proposed is not None and proposed.change_id:
            out.change.CopyFrom(await approvers.get_change(self.store, proposed.change_id))
        return out

    async def _propose(self, context: grpc.aio.ServicerContext, edit: approvers.Edit) -> admin_pb2.ApproverSet:
        async def go(operator: str) -> admin_pb2.ApproverSet:
            return await self._approver_set(await approvers.propose(self.store, self.bus, edit, operator, self.rng))

        return await self._call_as(context, go)

    async def ListApprovers(
        self, request: admin_pb2.ListApproversRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.ApproverSet:
        return await self._call(context, self._approver_set)

    async def AddApprover(
        self, request: admin_pb2.AddApproverRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.ApproverSet:
        return await self._propose(context, approvers.AddApprover(request.name, request.public_key, request.operator))

    async def RemoveApprover(
        self, request: admin_pb2.RemoveApproverRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.ApproverSet:
        return await self._propose(context, approvers.RemoveApprover(request.name))

    async def SetApproverThreshold(
        self, request: admin_pb2.SetApproverThresholdRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.ApproverSet:
        return await self._propose(context, approvers.SetThreshold(request.threshold))

    async def SetUnbatchedAllowance(
        self, request: admin_pb2.SetUnbatchedAllowanceRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.ApproverSet:
        return await self._propose(context, approvers.SetAllowance(request.per_hour))

    async def ListQuorumChanges(
        self, request: admin_pb2.ListQuorumChangesRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.ListQuorumChangesResponse:
        async def go() -> admin_pb2.ListQuorumChangesResponse:
            changes = await approvers.list_changes(self.store, request.state)
            return admin_pb2.ListQuorumChangesResponse(changes=changes)

        return await self._call(context, go)

    async def GetQuorumChange(
        self, request: admin_pb2.GetQuorumChangeRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.QuorumChangeInfo:
        return await self._call(context, lambda: approvers.get_change(self.store, request.change_id))

    async def _decide_change(
        self, request: admin_pb2.QuorumChangeDecisionRequest, context: grpc.aio.ServicerContext, approve: bool
    ) -> admin_pb2.QuorumChangeInfo:
        async def go(operator: str) -> admin_pb2.QuorumChangeInfo:
            await approvers.decide(
                self.store,
                self.bus,
                request.change_id,
                request.key_id,
                request.signature,
                approve=approve,
                caller=operator,
                reason=request.reason,
            )
            return await approvers.get_change(self.store, request.change_id)

        return await self._call_as(context, go)

    async def ApproveQuorumChange(
        self, request: admin_pb2.QuorumChangeDecisionRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.QuorumChangeInfo:
        return await self._decide_change(request, context, approve=True)

    async def RejectQuorumChange(
        self, request: admin_pb2.QuorumChangeDecisionRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.QuorumChangeInfo:
        return await self._decide_change(request, context, approve=False)

    # -- operators ---------------------------------------------------------------------------

    async def AddOperator(
        self, request: admin_pb2.AddOperatorRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.AddOperatorResponse:
        async def go(operator: str) -> admin_pb2.AddOperatorResponse:
            role = request.role or operators.DEFAULT_ROLE
            row, cert_pem = await operators.add(
                self.store, self.bus, self.ca, request.name, role, request.public_key_pem, operator
            )
            info = operators.info(row, await self.store.now_ms())
            return admin_pb2.AddOperatorResponse(operator=info, cert_pem=cert_pem, ca_pem=self.ca.ca_pem)

        return await self._call_as(context, go)

    async def ListOperators(
        self, request: admin_pb2.ListOperatorsRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.ListOperatorsResponse:
        async def go() -> admin_pb2.ListOperatorsResponse:
            now_ms = await self.store.now_ms()
            rows = await operators.list_all(self.store)
            return admin_pb2.ListOperatorsResponse(operators=[operators.info(r, now_ms) for r in rows])

        return await self._call(context, go)

    async def RevokeOperator(
        self, request: admin_pb2.RevokeOperatorRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.OperatorInfo:
        async def go(operator: str) -> admin_pb2.OperatorInfo:
            row = await operators.revoke(self.store, self.bus, request.name, request.reason, operator)
            return operators.info(row, await self.store.now_ms())

        return await self._call_as(context, go)

    # -- the destructive-batch quorum --------------------------------------------------

    async def _batch(self, batch_id: str) -> admin_pb2.BatchInfo:
        now_ms = await self.store.now_ms()
        async with self.store.transaction(write=False) as tx:
            row = await q_sql.get_batch(tx, batch_id)
            if row is None:
                raise NotFound(f"no batch named {batch_id!r}")
            leaves = await q_sql.leaves(tx, batch_id)
            decisions = await q_sql.decisions(tx, batch_id)
        return views.batch_info(row, leaves, decisions, now_ms)

    async def CreateBatch(
        self, request: admin_pb2.CreateBatchRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.BatchInfo:
        async def go(operator: str) -> admin_pb2.BatchInfo:
            req = quorum.BatchRequest(
                kind=request.kind,
                node_ids=list(request.node_ids),
                payload_json=request.payload_json,
                reason=request.reason,
                not_after_s=float(request.not_after_s or quorum.DEFAULT_BATCH_NOT_AFTER_S),
            )
            batch_id = await quorum.create_batch(self.store, self.bus, self.signer, req, operator, self.rng)
            return await self._batch(batch_id)

        return await self._call_as(context, go)

    async def ListBatches(
        self, request: admin_pb2.ListBatchesRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.ListBatchesResponse:
        async def go() -> admin_pb2.ListBatchesResponse:
            async with self.store.transaction(write=False) as tx:
                rows = await q_sql.list_batches(tx, "pending" if request.state == "expired" else request.state)
            infos = [await self._batch(str(r["id"])) for r in rows]
            if request.state:
                infos = [b for b in infos if b.state == request.state]
            return admin_pb2.ListBatchesResponse(batches=infos)

        return await self._call(context, go)

    async def GetBatch(
        self, request: admin_pb2.GetBatchRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.BatchInfo:
        return await self._call(context, lambda: self._batch(request.batch_id))

    async def _decide(
        self, request: admin_pb2.BatchDecisionRequest, context: grpc.aio.ServicerContext, approve: bool
    ) -> admin_pb2.BatchInfo:
        async def go(operator: str) -> admin_pb2.BatchInfo:
            await quorum.decide(
                self.store,
                self.bus,
                request.batch_id,
                request.key_id,
                request.signature,
                approve=approve,
                caller=operator,
                expires_at_ms=request.expires_at_ms,
                reason=request.reason,
            )
            return await self._batch(request.batch_id)

        return await self._call_as(context, go)

    async def ApproveBatch(
        self, request: admin_pb2.BatchDecisionRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.BatchInfo:
        return await self._decide(request, context, approve=True)

    async def RejectBatch(
        self, request: admin_pb2.BatchDecisionRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.BatchInfo:
        return await self._decide(request, context, approve=False)
