"""The Admin service: everything an operator does, behind an operator certificate and a role.

Every RPC of the service goes through the guard of `bc.api.admin_roles`
(`guarded`): the caller must be a live operator whose role is at least the
one `ROLE_NEEDED` names, and the body then runs acting for that operator.
A body calls one function and returns its message: a write of `bc.control`,
then (for its reply) or alone a read of `bc.control.reads.queries`, the one read
side the CLI and the TUI share; this module opens no transaction of its own.

Its dependencies come in through the constructor, built once by `bc serve`:
the `Signer` that signs the commands and specs it writes, the process's one
Random for the ids it makes, the `Secrets` that join-token secrets and a
rotated worker key are drawn from, and the job engine (`jobs`) that the job
RPCs (`bc.api.jobs_servicer`) and `CordonNode` submit to.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import grpc

from bc import __version__
from bc.api import admin_roles
from bc.api.admin_roles import guarded
from bc.api.capacity_servicer import CapacityRpcs, reserve_request
from bc.api.health_servicer import HealthRpcs
from bc.api.jobs_servicer import JobEngine, JobRpcs
from bc.api.metal_servicer import MetalRpcs
from bc.api.peers import operator_of
from bc.api.release_servicer import ReleaseRpcs
from bc.api.secrets_servicer import SecretRpcs
from bc.api.ssh_servicer import SshRpcs
from bc.control.base import actor
from bc.control.base.bus import Bus
from bc.control.capacity import reservations
from bc.control.capacity.placement_pass import PlacementPass
from bc.control.commands import queue as commands
from bc.control.commands import runs as command_runs
from bc.control.nodes import admin as node_admin
from bc.control.quorum import approvers
from bc.control.quorum import batches as quorum
from bc.control.quorum import spec_changes as spec_quorum
from bc.control.reads import queries, views
from bc.control.signing.signer import Signer
from bc.control.trust import identity, operators
from bc.control.trust import intent as intent_ctl
from bc.errors import BcError, Conflict, UsageError
from bc.pki.ca import CertificateAuthority
from bc.pki.identity import PeerIdentity
from bc.pki.secret_box import SecretBox
from bc.pki.secrets_source import Secrets
from bc.protocol.pb import admin_pb2
from bc.seams.clock import Clock
from bc.store import Row, Store
from bc.wire.status import abort_with
from bc.wire.stubs import admin_pb2_grpc

T = TypeVar("T")


def run_request(r: admin_pb2.RunCommandRequest) -> command_runs.RunRequest:
    """RunCommand's fields, and each member of EnqueueCommands, as the control plane takes them."""
    return command_runs.RunRequest(
        node_id=r.node_id,
        kind=r.kind,
        payload_json=r.payload_json,
        not_after_s=float(r.not_after_s),
        min_generation=r.min_generation,
        idempotency_key=r.idempotency_key,
    )


@guarded
class AdminServicer(
    JobRpcs, CapacityRpcs, SshRpcs, ReleaseRpcs, HealthRpcs, SecretRpcs, MetalRpcs, admin_pb2_grpc.AdminServicer
):
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
        ssh_ca_dir: Path,
        releases_dir: Path,
        release_url: str = "",
        secret_box: SecretBox | None = None,
        drain: Callable[[float], Awaitable[int]] | None = None,
        placement: PlacementPass | None = None,
    ) -> None:
        self.store, self.bus, self.ca, self.clock, self.gateway_id = store, bus, ca, clock, gateway_id
        self.placement = placement  # the process's placement pass: a reserve's inline pass goes on from it
        self.signer, self.rng, self.secrets, self.jobs = signer, rng, secrets, jobs
        self.ssh_ca_dir = ssh_ca_dir  # <data-dir>/ssh-ca: the SSH user CA key (bc.control.trust.ssh)
        self.releases_dir = releases_dir
        self.secret_box = secret_box  # the secrets' at-rest key beside the CA (bc.pki.secret_box)
        self.release_url = release_url
        self.drain = drain  # bc serve drain: this process's own (bc.assembly.server.Server.drain)

    def _identity(self, context: grpc.aio.ServicerContext) -> PeerIdentity:
        return operator_of(context, self.ca.certificate)

    async def _authorize(self, peer: PeerIdentity, need: str, what: str) -> actor.Caller:
        return await operators.authorize(self.store, peer, need, what)

    async def _caller(self, context: grpc.aio.ServicerContext, need: str, what: str) -> actor.Caller:
        return await self._authorize(self._identity(context), need, what)

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
        return await self._call(context, lambda: queries.fleet(self.store, include_deleted=request.include_deleted))

    async def ListNodesStream(
        self, request: admin_pb2.ListNodesRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[admin_pb2.ListNodesResponse]:
        try:
            pages = queries.fleet_pages(
                self.store,
                include_deleted=request.include_deleted,
                page_size=request.page_size or queries.NODES_PAGE,
            )
            async for page in pages:
                yield page
        except BcError as e:
            await abort_with(context, e)

    async def GetNode(self, request: admin_pb2.GetNodeRequest, context: grpc.aio.ServicerContext) -> admin_pb2.NodeInfo:
        return await self._call(context, lambda: queries.node(self.store, request.node_id))

    async def GetSpec(self, request: admin_pb2.GetNodeRequest, context: grpc.aio.ServicerContext) -> admin_pb2.SpecInfo:
        return await self._call(context, lambda: queries.spec(self.store, request.node_id))

    async def SetSpecSection(
        self, request: admin_pb2.SetSpecSectionRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.SpecInfo:
        async def go() -> admin_pb2.SpecInfo:
            # The role is looked at again for the change itself: a root-equivalent one is admin's (and the quorum's).
            caller = await self._caller(context, *admin_roles.needed("SetSpecSection"))
            outcome = await spec_quorum.set_section(
                self.store,
                self.bus,
                self.signer,
                self.rng,
                request.node_id,
                request.section,
                request.section_json or "{}",
                caller,
            )
            info = await queries.spec(self.store, request.node_id)
            info.pending_batch_id = outcome.batch_id
            return info

        return await self._call(context, go)

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
                placement=self.placement,
            )
            return await queries.reservation(self.store, str(row["id"]))

        return await self._call(context, go)

    async def Release(
        self, request: admin_pb2.ReleaseRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.Reservation:
        async def go() -> admin_pb2.Reservation:
            row = await reservations.release(self.store, self.bus, self.signer, request.reservation_id)
            return await queries.reservation(self.store, str(row["id"]))

        return await self._call(context, go)

    async def ListReservations(
        self, request: admin_pb2.ListReservationsRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.ListReservationsResponse:
        async def go() -> admin_pb2.ListReservationsResponse:
            return await queries.reservations(
                self.store,
                node_id=request.node_id,
                include_released=request.include_released,
                state=request.state,
                tenant=request.tenant,
            )

        return await self._call(context, go)

    async def ListEvents(
        self, request: admin_pb2.ListEventsRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.ListEventsResponse:
        async def go() -> admin_pb2.ListEventsResponse:
            return await queries.events(
                self.store, after_seq=request.after_seq, limit=request.limit, type_prefix=request.type_prefix
            )

        return await self._call(context, go)

    async def Watch(
        self, request: admin_pb2.WatchRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[admin_pb2.EventRecord]:
        after = request.after_seq
        while True:
            records = await queries.events_after(self.store, after, request.type_prefix)
            for record in records:
                after = record.seq
                yield record
            if not records:
                await self.bus.wait_events(1.0)

    async def Drain(
        self, request: admin_pb2.DrainRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.DrainResponse:
        async def go() -> admin_pb2.DrainResponse:
            over = request.over_s or 60
            if not 1 <= over <= 600:
                raise UsageError(f"--over must be between 1 and 600 seconds, not {request.over_s}")
            if self.drain is None:
                raise Conflict("this server cannot drain")
            sessions = await self.drain(float(over))
            return admin_pb2.DrainResponse(gateway_id=self.gateway_id, sessions=sessions, over_s=over)

        return await self._call(context, go)

    async def ServerInfo(
        self, request: admin_pb2.ServerInfoRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.ServerInfoResponse:
        async def go(operator: str) -> admin_pb2.ServerInfoResponse:
            facts = await queries.server_facts(self.store, operator)
            return admin_pb2.ServerInfoResponse(
                version=__version__,
                ca_fingerprint=self.ca.fingerprint,
                server_time_ms=facts.now_ms,
                store=self.store.description,
                gateway_id=self.gateway_id,
                operator=operator,
                role=facts.role,
                event_seq=facts.event_seq,
            )

        return await self._call_as(context, go)

    # -- commands ------------------------------------------------------------------

    async def _command_info(self, row: Row) -> admin_pb2.CommandInfo:
        return await queries.command_info(self.store, row)

    async def RunCommand(
        self, request: admin_pb2.RunCommandRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.CommandInfo:
        async def go(operator: str) -> admin_pb2.CommandInfo:
            [row] = await command_runs.run_commands(
                self.store, self.bus, self.signer, [run_request(request)], operator, self.rng
            )
            return await self._command_info(row)

        return await self._call_as(context, go)

    async def EnqueueCommands(
        self, request: admin_pb2.EnqueueCommandsRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.EnqueueCommandsResponse:
        async def go(operator: str) -> admin_pb2.EnqueueCommandsResponse:
            runs = [run_request(c) for c in request.commands]
            rows = await command_runs.run_commands(self.store, self.bus, self.signer, runs, operator, self.rng)
            return await queries.enqueued(self.store, rows)

        return await self._call_as(context, go)

    async def GetCommand(
        self, request: admin_pb2.GetCommandRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.CommandInfo:
        async def go() -> admin_pb2.CommandInfo:
            return await queries.command(self.store, request.command_id)

        return await self._call(context, go)

    async def ListCommands(
        self, request: admin_pb2.ListCommandsRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.ListCommandsResponse:
        async def go() -> admin_pb2.ListCommandsResponse:
            return await queries.commands(self.store, node_id=request.node_id, state=request.state, limit=request.limit)

        return await self._call(context, go)

    async def CancelCommand(
        self, request: admin_pb2.CancelCommandRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.CommandInfo:
        async def go() -> admin_pb2.CommandInfo:
            row = await commands.request_cancel(self.store, self.bus, request.command_id, request.reason)
            return await self._command_info(row)

        return await self._call(context, go)

    # -- node lifecycle and PKI ------------------------------------------------------

    async def RevokeNode(
        self, request: admin_pb2.RevokeNodeRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.NodeInfo:
        async def go() -> admin_pb2.NodeInfo:
            await node_admin.revoke(self.store, self.bus, request.node_id, request.reason)
            return await queries.node_summary(self.store, request.node_id)

        return await self._call(context, go)

    async def CordonNode(
        self, request: admin_pb2.CordonNodeRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.NodeInfo:
        async def go(operator: str) -> admin_pb2.NodeInfo:
            await self.cordon_through_engine(request.node_id, request.cordon, operator)
            return await queries.node_summary(self.store, request.node_id)

        return await self._call_as(context, go)

    async def LabelNode(
        self, request: admin_pb2.LabelNodeRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.NodeInfo:
        async def go() -> admin_pb2.NodeInfo:
            await node_admin.label(
                self.store, self.bus, request.node_id, dict(request.set), list(request.remove), self.signer
            )
            return await queries.node_summary(self.store, request.node_id)

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
            info.root_on_host = keys.root_signer() is not None
        return info

    async def GetPki(self, request: admin_pb2.GetPkiRequest, context: grpc.aio.ServicerContext) -> admin_pb2.PkiInfo:
        async def go() -> admin_pb2.PkiInfo:
            return self._pki_info()

        return await self._call(context, go)

    async def RotateSigningKey(
        self, request: admin_pb2.RotateSigningKeyRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.PkiInfo:
        async def go() -> admin_pb2.PkiInfo:
            issued = (request.worker_key_pem, request.worker_cert_pem) if request.worker_cert_pem else None
            specs_n, cmds_n = await intent_ctl.rotate(
                self.store, self.bus, self.signer, self.clock, self.rng, self.secrets, issued=issued
            )
            info = self._pki_info()
            info.resigned_specs, info.resigned_commands = specs_n, cmds_n
            return info

        return await self._call(context, go)

    # -- the quorum settings and their changes ---------------------------------------------

    def _quorum_root(self) -> approvers.RootSeal | None:
        keys = self.signer.keys
        if keys is None:
            return None
        on_host = keys.root_signer()
        return approvers.RootSeal(keys.root_public_raw, on_host.key.sign if on_host is not None else None)

    async def _propose(
        self, context: grpc.aio.ServicerContext, edit: approvers.Edit, root_signature: bytes, preview: bool
    ) -> admin_pb2.ApproverSet:
        async def go(operator: str) -> admin_pb2.ApproverSet:
            proposed = await approvers.propose(
                self.store,
                self.bus,
                edit,
                operator,
                self.rng,
                root=self._quorum_root(),
                given_root_signature=root_signature,
                preview=preview,
            )
            out = await queries.approver_set(self.store, proposed.change_id)
            if proposed.frm is not None and proposed.to is not None:
                out.change.CopyFrom(approvers.preview_info(proposed.frm, proposed.to, operator))
            return out

        return await self._call_as(context, go)

    async def ListApprovers(
        self, request: admin_pb2.ListApproversRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.ApproverSet:
        return await self._call(context, lambda: queries.approver_set(self.store))

    async def AddApprover(
        self, request: admin_pb2.AddApproverRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.ApproverSet:
        edit = approvers.AddApprover(request.name, request.public_key, request.operator)
        return await self._propose(context, edit, request.root_signature, request.preview)

    async def RemoveApprover(
        self, request: admin_pb2.RemoveApproverRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.ApproverSet:
        edit = approvers.RemoveApprover(request.name, request.threshold)
        return await self._propose(context, edit, request.root_signature, request.preview)

    async def SetApproverThreshold(
        self, request: admin_pb2.SetApproverThresholdRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.ApproverSet:
        return await self._propose(
            context, approvers.SetThreshold(request.threshold), request.root_signature, request.preview
        )

    async def SetUnbatchedAllowance(
        self, request: admin_pb2.SetUnbatchedAllowanceRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.ApproverSet:
        return await self._propose(
            context, approvers.SetAllowance(request.per_hour), request.root_signature, request.preview
        )

    async def ListQuorumChanges(
        self, request: admin_pb2.ListQuorumChangesRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.ListQuorumChangesResponse:
        return await self._call(context, lambda: queries.quorum_changes(self.store, request.state))

    async def GetQuorumChange(
        self, request: admin_pb2.GetQuorumChangeRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.QuorumChangeInfo:
        return await self._call(context, lambda: queries.quorum_change(self.store, request.change_id))

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
            return await queries.quorum_change(self.store, request.change_id)

        return await self._call_as(context, go)

    async def ApproveQuorumChange(
        self, request: admin_pb2.QuorumChangeDecisionRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.QuorumChangeInfo:
        return await self._decide_change(request, context, approve=True)

    async def RejectQuorumChange(
        self, request: admin_pb2.QuorumChangeDecisionRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.QuorumChangeInfo:
        return await self._decide_change(request, context, approve=False)

    async def WithdrawQuorumChange(
        self, request: admin_pb2.WithdrawQuorumChangeRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.QuorumChangeInfo:
        async def go(operator: str) -> admin_pb2.QuorumChangeInfo:
            await approvers.withdraw(self.store, self.bus, request.change_id, operator)
            return await queries.quorum_change(self.store, request.change_id)

        return await self._call_as(context, go)

    # -- operators ---------------------------------------------------------------------------

    async def AddOperator(
        self, request: admin_pb2.AddOperatorRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.AddOperatorResponse:
        async def go(operator: str) -> admin_pb2.AddOperatorResponse:
            role = request.role or operators.DEFAULT_ROLE
            row, cert_pem = await operators.add(
                self.store, self.bus, self.ca, request.name, role, request.public_key_pem, operator
            )
            info = await queries.operator_info(self.store, row)
            return admin_pb2.AddOperatorResponse(operator=info, cert_pem=cert_pem, ca_pem=self.ca.ca_pem)

        return await self._call_as(context, go)

    async def ListOperators(
        self, request: admin_pb2.ListOperatorsRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.ListOperatorsResponse:
        return await self._call(context, lambda: queries.operators(self.store))

    async def RevokeOperator(
        self, request: admin_pb2.RevokeOperatorRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.OperatorInfo:
        async def go(operator: str) -> admin_pb2.OperatorInfo:
            row = await operators.revoke(self.store, self.bus, request.name, request.reason, operator)
            return await queries.operator_info(self.store, row)

        return await self._call_as(context, go)

    async def SetOperatorRole(
        self, request: admin_pb2.SetOperatorRoleRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.OperatorInfo:
        async def go(operator: str) -> admin_pb2.OperatorInfo:
            row = await operators.set_role(self.store, self.bus, request.name, request.role, request.reason, operator)
            return await queries.operator_info(self.store, row)

        return await self._call_as(context, go)

    # -- the destructive-batch quorum --------------------------------------------------

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
            return await queries.batch(self.store, batch_id)

        return await self._call_as(context, go)

    async def ListBatches(
        self, request: admin_pb2.ListBatchesRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.ListBatchesResponse:
        return await self._call(context, lambda: queries.batches(self.store, request.state))

    async def GetBatch(
        self, request: admin_pb2.GetBatchRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.BatchInfo:
        return await self._call(context, lambda: queries.batch(self.store, request.batch_id))

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
            if approve:  # an approved root-equivalent spec change is written now, or by the sweeper's next pass
                await spec_quorum.apply_now(self.store, self.bus, self.signer, request.batch_id)
            return await queries.batch(self.store, request.batch_id)

        return await self._call_as(context, go)

    async def ApproveBatch(
        self, request: admin_pb2.BatchDecisionRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.BatchInfo:
        return await self._decide(request, context, approve=True)

    async def RejectBatch(
        self, request: admin_pb2.BatchDecisionRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.BatchInfo:
        return await self._decide(request, context, approve=False)
