"""The Admin client: the one way the CLI and the TUI talk to `bc serve`.

It dials the address in the operator config over mutual TLS, gives every unary
call a deadline so that a wedged server cannot hang a shell script, and turns
gRPC failures into our error tree (`bc.wire.status`), so callers handle
`BcError`s and never see grpc types. Replies come back as the protobuf
messages of `bc.protocol.pb.admin_pb2`.

    async with AdminClient.discover() as admin:
        nodes = await admin.list_nodes()
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

import grpc
from google.protobuf.message import Message

from bc.client.admin_calls import AdminCalls
from bc.client.reconnect import CHANNEL_OPTIONS
from bc.client.tls_probe import refused_certificate
from bc.errors import BcError, ProtocolError, Unauthenticated, Unavailable, UsageError
from bc.protocol.limits import LIMITS
from bc.protocol.pb import admin_pb2, metal_pb2, secrets_pb2
from bc.runtime.config import OperatorConfig, find_operator_config
from bc.wire.status import status_to_error
from bc.wire.tls import channel_credentials

if TYPE_CHECKING:  # loaded by the tunnel calls themselves, not at every CLI start
    from bc.protocol.pb import tunnel_pb2

DEFAULT_TIMEOUT_S = 15.0
CONNECT_RETRY_PAUSES_S = (0.2, 0.6)
"""A unary call whose connection was never made is sent again after these pauses: nothing reached the server,
so even a write is safe to send again. (A server busy enough to drop one handshake, as on a loaded CI host,
was a one-in-thousands failure of a whole command.)"""
ENQUEUE_S_PER_COMMAND = 0.005
"""`EnqueueCommands`' deadline per command when that is longer than the default (10,000 commands: 50 s)."""
RELEASE_CHUNK = 1 << 20

_Reply = TypeVar("_Reply", bound=Message)


# After a write whose answer was lost, the read that tells whether it happened.
WRITE_CHECKS = {
    "CreateToken": "bc events --type token.",
    "Drain": "bc nodes (whose gateway they are on)",
    "SshCaInit": "bc ssh ca show",
    "SshGrant": "bc ssh list",
    "SshRevoke": "bc ssh list",
    "SshRecordCert": "bc ssh list",
    "SetSpecSection": "bc spec show NODE",
    "Reserve": "bc reservations",
    "Release": "bc reservations",
    "RunCommand": "bc cmd list --node NODE",
    "EnqueueCommands": "bc cmd list",
    "CancelCommand": "bc cmd show ID",
    "RevokeNode": "bc nodes",
    "CordonNode": "bc nodes",
    "LabelNode": "bc nodes show",
    "DeleteNode": "bc nodes",
    "RotateSigningKey": "bc pki show",
    "AddApprover": "bc approvers list",
    "RemoveApprover": "bc approvers list",
    "SetApproverThreshold": "bc approvers list",
    "SetUnbatchedAllowance": "bc approvers list",
    "CreateBatch": "bc batch list",
    "ApproveBatch": "bc batch show BATCH",
    "RejectBatch": "bc batch show BATCH",
    "ApproveQuorumChange": "bc approvers list",
    "RejectQuorumChange": "bc approvers list",
    "WithdrawQuorumChange": "bc approve show CHANGE",
    "AddOperator": "bc operators list",
    "RevokeOperator": "bc operators list",
    "SetOperatorRole": "bc operators list",
    "SubmitJob": "bc jobs list",
    "CancelJob": "bc jobs show DAG",
    "JobSlots": "bc jobs slots",
    "SetHealthPolicy": "bc health policy show",
    "CordonGpu": "bc health",
    "ReturnGpu": "bc health",
    "AddReleaseKey": "bc release status",
    "PublishRelease": "bc release status",
    "SetSecret": "bc secret versions NAME",
    "RemoveSecret": "bc secret list",
    "EnrollMachine": "bc metal list",
    "RemoveMachine": "bc metal list",
    "ProvisionMachines": "bc metal list",
}

_READ_PREFIXES = ("List", "Get", "Watch", "ServerInfo")

# grpc's words when a connection that was up ends under a call ("failed to connect to all addresses"
# is what a call gets when there was never one).
_BROKEN_HINTS = ("stream removed", "socket closed", "connection reset", "goaway", "broken pipe", "eof")


def is_write(rpc: str) -> bool:
    """Every Admin call but the reads changes something stored."""
    return not rpc.startswith(_READ_PREFIXES)


def never_connected(code: grpc.StatusCode, details: str) -> bool:
    """grpc made no connection, so the request was never sent (grpc's own "failed to connect" prefix)."""
    return code == grpc.StatusCode.UNAVAILABLE and "failed to connect" in details.lower()


def broke_mid_call(code: grpc.StatusCode, details: str) -> bool:
    """The server was reached and the call ended without an answer: the request may have been applied."""
    low = details.lower()
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return True
    if code != grpc.StatusCode.UNAVAILABLE or "failed to connect" in low:
        return False
    return any(h in low for h in _BROKEN_HINTS)


def _reason(code: grpc.StatusCode, details: str) -> str:
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return "no answer in time"
    return details.strip() or code.name.lower()


class AdminClient:
    """An async context manager around one channel to `bc serve`'s Admin service."""

    def __init__(self, config: OperatorConfig, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self._config = config
        self._timeout_s = timeout_s
        self._channel: Any = None
        self._calls: AdminCalls | None = None
        self._closed = False  # it was open: a call now is a connection gone, not a misuse

    @classmethod
    def discover(cls, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> AdminClient:
        """A client for the operator config `bc.runtime.config.find_operator_config` finds."""
        return cls(find_operator_config(), timeout_s=timeout_s)

    @property
    def server(self) -> str:
        return self._config.server

    async def __aenter__(self) -> AdminClient:
        creds = channel_credentials(self._config.ca_pem, self._config.key_pem, self._config.cert_pem)
        # The largest single-item replies (GetSpec of a maximal spec, a command with a maximal result) fit
        # under the table's gRPC limit (bc.protocol.limits); a bigger message is exit 2 naming it, not exit 5.
        # grpc's reconnect back-off capped as the clients' own is (bc.client.reconnect): a restarted server is found
        # within seconds by a channel kept open across it.
        options = [*LIMITS.grpc_options(), *CHANNEL_OPTIONS]
        self._channel = grpc.aio.secure_channel(self._config.server, creds, options=options)
        self._calls = AdminCalls(self._channel)  # each call made on first use, not all 59 as the stub does
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        channel, self._channel, self._calls = self._channel, None, None
        self._closed = True
        if channel is not None:
            await channel.close()

    # -- tokens and nodes -----------------------------------------------------

    async def create_token(
        self, node_id: str, *, role: str = "node", ttl_s: int = 3600
    ) -> admin_pb2.CreateTokenResponse:
        req = admin_pb2.CreateTokenRequest(node_id=node_id, role=role, ttl_s=ttl_s)
        return await self._unary("CreateToken", req, admin_pb2.CreateTokenResponse)

    async def list_nodes(self, *, include_deleted: bool = False) -> list[admin_pb2.NodeInfo]:
        return list((await self.fleet_snapshot(include_deleted=include_deleted)).nodes)

    async def fleet_snapshot(self, *, include_deleted: bool = False) -> admin_pb2.ListNodesResponse:
        """The nodes and the `event_seq` they were read at: `watch(after_seq=event_seq)` continues them
        (and may repeat a change the listing shows: `fleet_pages`)."""
        out = admin_pb2.ListNodesResponse()
        async for page in self.fleet_pages(include_deleted=include_deleted):
            out.nodes.extend(page.nodes)
            out.event_seq = page.event_seq
        return out

    async def fleet_pages(
        self, *, include_deleted: bool = False, page_size: int = 0
    ) -> AsyncGenerator[admin_pb2.ListNodesResponse, None]:
        """The fleet in pages as the server reads them (`ListNodesStream`, `page_size` 0: the server's), each
        with the `event_seq` of the first (bc.control.reads.queries.fleet_pages says what it guarantees).

        The whole listing has the unary calls' deadline; a server older than the stream answers the unary
        `ListNodes` instead, in one page."""
        req = admin_pb2.ListNodesRequest(include_deleted=include_deleted, page_size=page_size)
        for pause_s in (*CONNECT_RETRY_PAUSES_S, None):
            call = self._call("ListNodesStream")(req, timeout=self._timeout_s)
            got = False
            try:
                async for page in call:
                    got = True
                    yield self._check(page, admin_pb2.ListNodesResponse)
                return
            except grpc.aio.AioRpcError as e:
                code, details = e.code(), e.details() or ""
                if not got and code == grpc.StatusCode.UNIMPLEMENTED:
                    legacy = admin_pb2.ListNodesRequest(include_deleted=include_deleted)
                    yield await self._unary("ListNodes", legacy, admin_pb2.ListNodesResponse)
                    return
                # As `_sent`: nothing was sent while no connection was made, so the listing starts again.
                if got or pause_s is None or not never_connected(code, details):
                    raise await self._error(e) from e
            finally:
                call.cancel()
            await asyncio.sleep(pause_s)

    async def get_node(self, node_id: str) -> admin_pb2.NodeInfo:
        """One node in detail, with the `event_seq` it was read at."""
        return await self._unary("GetNode", admin_pb2.GetNodeRequest(node_id=node_id), admin_pb2.NodeInfo)

    # -- specs ------------------------------------------------------------------

    async def get_spec(self, node_id: str) -> admin_pb2.SpecInfo:
        return await self._unary("GetSpec", admin_pb2.GetNodeRequest(node_id=node_id), admin_pb2.SpecInfo)

    async def set_spec_section(self, node_id: str, section: str, section_json: str) -> admin_pb2.SpecInfo:
        req = admin_pb2.SetSpecSectionRequest(node_id=node_id, section=section, section_json=section_json)
        return await self._unary("SetSpecSection", req, admin_pb2.SpecInfo)

    # -- reservations -------------------------------------------------------------

    async def reserve(
        self,
        gpus: int,
        *,
        node_id: str = "",
        device_class: str = "gpu",
        binding: str = "hold",
        start_ms: int = 0,
        end_ms: int = 0,
        duration_ms: int = 0,
        cpus: int = 0,
        memory_bytes: int = 0,
        hugepages_1g: int = 0,
        tenant: str = "",
        selector: dict[str, str] | None = None,
    ) -> admin_pb2.Reservation:
        req = admin_pb2.ReserveRequest(
            gpus=gpus,
            node_id=node_id,
            device_class=device_class,
            binding=binding,
            start_ms=start_ms,
            end_ms=end_ms,
            duration_ms=duration_ms,
            cpus=cpus,
            memory_bytes=memory_bytes,
            hugepages_1g=hugepages_1g,
            tenant=tenant,
            selector=selector or {},
        )
        return await self._unary("Reserve", req, admin_pb2.Reservation)

    async def get_reservation(self, reservation_id: str) -> admin_pb2.Reservation:
        req = admin_pb2.GetReservationRequest(reservation_id=reservation_id)
        return await self._unary("GetReservation", req, admin_pb2.Reservation)

    async def explain_reservation(self, reservation_id: str) -> admin_pb2.PlacementExplanation:
        req = admin_pb2.GetReservationRequest(reservation_id=reservation_id)
        return await self._unary("GetPlacementExplanation", req, admin_pb2.PlacementExplanation)

    async def usage(self, *, since_ms: int = 0, until_ms: int = 0, by: str = "") -> admin_pb2.UsageResponse:
        req = admin_pb2.UsageRequest(since_ms=since_ms, until_ms=until_ms, by=by)
        return await self._unary("GetUsage", req, admin_pb2.UsageResponse)

    async def release(self, reservation_id: str) -> admin_pb2.Reservation:
        req = admin_pb2.ReleaseRequest(reservation_id=reservation_id)
        return await self._unary("Release", req, admin_pb2.Reservation)

    async def list_reservations(
        self, *, node_id: str = "", include_released: bool = False, state: str = "", tenant: str = ""
    ) -> list[admin_pb2.Reservation]:
        resp = await self.reservations_snapshot(
            node_id=node_id, include_released=include_released, state=state, tenant=tenant
        )
        return list(resp.reservations)

    async def reservations_snapshot(
        self, *, node_id: str = "", include_released: bool = False, state: str = "", tenant: str = ""
    ) -> admin_pb2.ListReservationsResponse:
        """`list_reservations` with the `event_seq` they were read at."""
        req = admin_pb2.ListReservationsRequest(
            node_id=node_id, include_released=include_released, state=state, tenant=tenant
        )
        return await self._unary("ListReservations", req, admin_pb2.ListReservationsResponse)

    # -- commands -----------------------------------------------------------------------

    async def run_command(
        self,
        node_id: str,
        kind: str,
        *,
        payload_json: str = "",
        not_after_s: int = 0,
        min_generation: int = 0,
        idempotency_key: str = "",
    ) -> admin_pb2.CommandInfo:
        """Queue a command; `not_after_s` 0 is the server's default (10 minutes)."""
        req = admin_pb2.RunCommandRequest(
            node_id=node_id,
            kind=kind,
            payload_json=payload_json,
            not_after_s=not_after_s,
            min_generation=min_generation,
            idempotency_key=idempotency_key,
        )
        return await self._unary("RunCommand", req, admin_pb2.CommandInfo)

    async def enqueue_commands(self, commands: list[admin_pb2.RunCommandRequest]) -> list[admin_pb2.CommandInfo]:
        """Queue many commands in one call and one transaction, all or none; the commands in order.

        A request over gRPC's message limit is refused here, before anything is sent (exit 2).
        """
        req = admin_pb2.EnqueueCommandsRequest(commands=commands)
        size = req.ByteSize()
        if size > LIMITS.grpc_message_bytes:
            raise UsageError(
                f"the request for these {len(commands):,} commands is {size:,} bytes; the limit is"
                f" {LIMITS.grpc_message_bytes:,} bytes (grpc_message_bytes): send fewer commands per call"
            )
        # One transaction of about a millisecond a command on this machine: the deadline grows with the call.
        timeout_s = max(self._timeout_s, ENQUEUE_S_PER_COMMAND * len(commands))
        resp = await self._unary("EnqueueCommands", req, admin_pb2.EnqueueCommandsResponse, timeout_s=timeout_s)
        return list(resp.commands)

    async def get_command(self, command_id: str) -> admin_pb2.CommandInfo:
        req = admin_pb2.GetCommandRequest(command_id=command_id)
        return await self._unary("GetCommand", req, admin_pb2.CommandInfo)

    async def list_commands(self, *, node_id: str = "", state: str = "", limit: int = 0) -> list[admin_pb2.CommandInfo]:
        """Newest first; `limit` 0 is the server's default (100)."""
        return list((await self.commands_snapshot(node_id=node_id, state=state, limit=limit)).commands)

    async def commands_snapshot(
        self, *, node_id: str = "", state: str = "", limit: int = 0
    ) -> admin_pb2.ListCommandsResponse:
        """`list_commands` with the `event_seq` they were read at."""
        req = admin_pb2.ListCommandsRequest(node_id=node_id, state=state, limit=limit)
        return await self._unary("ListCommands", req, admin_pb2.ListCommandsResponse)

    async def cancel_command(self, command_id: str, *, reason: str = "") -> admin_pb2.CommandInfo:
        req = admin_pb2.CancelCommandRequest(command_id=command_id, reason=reason)
        return await self._unary("CancelCommand", req, admin_pb2.CommandInfo)

    # -- node lifecycle and PKI ---------------------------------------------------

    async def revoke_node(self, node_id: str, *, reason: str = "") -> admin_pb2.NodeInfo:
        req = admin_pb2.RevokeNodeRequest(node_id=node_id, reason=reason)
        return await self._unary("RevokeNode", req, admin_pb2.NodeInfo)

    async def cordon_node(self, node_id: str, cordon: bool) -> admin_pb2.NodeInfo:
        req = admin_pb2.CordonNodeRequest(node_id=node_id, cordon=cordon)
        return await self._unary("CordonNode", req, admin_pb2.NodeInfo)

    async def label_node(self, node_id: str, set_: dict[str, str], remove: list[str]) -> admin_pb2.NodeInfo:
        req = admin_pb2.LabelNodeRequest(node_id=node_id, set=set_, remove=remove)
        return await self._unary("LabelNode", req, admin_pb2.NodeInfo)

    async def delete_node(self, node_id: str) -> admin_pb2.DeleteNodeResponse:
        return await self._unary("DeleteNode", admin_pb2.GetNodeRequest(node_id=node_id), admin_pb2.DeleteNodeResponse)

    async def get_pki(self) -> admin_pb2.PkiInfo:
        return await self._unary("GetPki", admin_pb2.GetPkiRequest(), admin_pb2.PkiInfo)

    async def rotate_signing_key(self, worker_key_pem: bytes = b"", worker_cert_pem: bytes = b"") -> admin_pb2.PkiInfo:
        req = admin_pb2.RotateSigningKeyRequest(worker_key_pem=worker_key_pem, worker_cert_pem=worker_cert_pem)
        return await self._unary("RotateSigningKey", req, admin_pb2.PkiInfo)

    # -- the destructive-batch quorum ------------------------------------------------

    async def list_approvers(self) -> admin_pb2.ApproverSet:
        return await self._unary("ListApprovers", admin_pb2.ListApproversRequest(), admin_pb2.ApproverSet)

    async def add_approver(
        self, name: str, public_key: str, *, operator: str = "", root_signature: bytes = b"", preview: bool = False
    ) -> admin_pb2.ApproverSet:
        req = admin_pb2.AddApproverRequest(
            name=name, public_key=public_key, operator=operator, root_signature=root_signature, preview=preview
        )
        return await self._unary("AddApprover", req, admin_pb2.ApproverSet)

    async def remove_approver(
        self, name: str, *, root_signature: bytes = b"", preview: bool = False, threshold: int = 0
    ) -> admin_pb2.ApproverSet:
        req = admin_pb2.RemoveApproverRequest(
            name=name, root_signature=root_signature, preview=preview, threshold=threshold
        )
        return await self._unary("RemoveApprover", req, admin_pb2.ApproverSet)

    async def set_approver_threshold(
        self, k: int, *, root_signature: bytes = b"", preview: bool = False
    ) -> admin_pb2.ApproverSet:
        req = admin_pb2.SetApproverThresholdRequest(threshold=k, root_signature=root_signature, preview=preview)
        return await self._unary("SetApproverThreshold", req, admin_pb2.ApproverSet)

    async def set_unbatched_allowance(
        self, per_hour: int, *, root_signature: bytes = b"", preview: bool = False
    ) -> admin_pb2.ApproverSet:
        req = admin_pb2.SetUnbatchedAllowanceRequest(per_hour=per_hour, root_signature=root_signature, preview=preview)
        return await self._unary("SetUnbatchedAllowance", req, admin_pb2.ApproverSet)

    async def create_batch(
        self, kind: str, node_ids: list[str], payload_json: str, *, reason: str = "", not_after_s: int = 0
    ) -> admin_pb2.BatchInfo:
        req = admin_pb2.CreateBatchRequest(
            kind=kind, node_ids=node_ids, payload_json=payload_json, reason=reason, not_after_s=not_after_s
        )
        return await self._unary("CreateBatch", req, admin_pb2.BatchInfo)

    async def list_batches(self, *, state: str = "") -> list[admin_pb2.BatchInfo]:
        return list((await self.batches_snapshot(state=state)).batches)

    async def batches_snapshot(self, *, state: str = "") -> admin_pb2.ListBatchesResponse:
        """`list_batches` with the `event_seq` they were read at."""
        req = admin_pb2.ListBatchesRequest(state=state)
        return await self._unary("ListBatches", req, admin_pb2.ListBatchesResponse)

    async def get_batch(self, batch_id: str) -> admin_pb2.BatchInfo:
        return await self._unary("GetBatch", admin_pb2.GetBatchRequest(batch_id=batch_id), admin_pb2.BatchInfo)

    async def decide_batch(
        self,
        batch_id: str,
        key_id: str,
        signature: bytes,
        *,
        approve: bool,
        expires_at_ms: int = 0,
        reason: str = "",
    ) -> admin_pb2.BatchInfo:
        req = admin_pb2.BatchDecisionRequest(
            batch_id=batch_id, key_id=key_id, signature=signature, expires_at_ms=expires_at_ms, reason=reason
        )
        return await self._unary("ApproveBatch" if approve else "RejectBatch", req, admin_pb2.BatchInfo)

    async def list_quorum_changes(self, *, state: str = "") -> list[admin_pb2.QuorumChangeInfo]:
        req = admin_pb2.ListQuorumChangesRequest(state=state)
        resp = await self._unary("ListQuorumChanges", req, admin_pb2.ListQuorumChangesResponse)
        return list(resp.changes)

    async def get_quorum_change(self, change_id: str) -> admin_pb2.QuorumChangeInfo:
        req = admin_pb2.GetQuorumChangeRequest(change_id=change_id)
        return await self._unary("GetQuorumChange", req, admin_pb2.QuorumChangeInfo)

    async def decide_quorum_change(
        self, change_id: str, key_id: str, signature: bytes, *, approve: bool, reason: str = ""
    ) -> admin_pb2.QuorumChangeInfo:
        req = admin_pb2.QuorumChangeDecisionRequest(
            change_id=change_id, key_id=key_id, signature=signature, reason=reason
        )
        rpc = "ApproveQuorumChange" if approve else "RejectQuorumChange"
        return await self._unary(rpc, req, admin_pb2.QuorumChangeInfo)

    async def withdraw_quorum_change(self, change_id: str) -> admin_pb2.QuorumChangeInfo:
        req = admin_pb2.WithdrawQuorumChangeRequest(change_id=change_id)
        return await self._unary("WithdrawQuorumChange", req, admin_pb2.QuorumChangeInfo)

    # -- operators ---------------------------------------------------------------------

    async def add_operator(self, name: str, role: str, public_key_pem: bytes) -> admin_pb2.AddOperatorResponse:
        req = admin_pb2.AddOperatorRequest(name=name, role=role, public_key_pem=public_key_pem)
        return await self._unary("AddOperator", req, admin_pb2.AddOperatorResponse)

    async def list_operators(self) -> list[admin_pb2.OperatorInfo]:
        resp = await self._unary("ListOperators", admin_pb2.ListOperatorsRequest(), admin_pb2.ListOperatorsResponse)
        return list(resp.operators)

    async def revoke_operator(self, name: str, *, reason: str = "") -> admin_pb2.OperatorInfo:
        req = admin_pb2.RevokeOperatorRequest(name=name, reason=reason)
        return await self._unary("RevokeOperator", req, admin_pb2.OperatorInfo)

    async def set_operator_role(self, name: str, role: str, *, reason: str = "") -> admin_pb2.OperatorInfo:
        req = admin_pb2.SetOperatorRoleRequest(name=name, role=role, reason=reason)
        return await self._unary("SetOperatorRole", req, admin_pb2.OperatorInfo)

    # -- jobs ----------------------------------------------------------------------------

    async def submit_job(self, request: admin_pb2.SubmitJobRequest) -> admin_pb2.JobInfo:
        return await self._unary("SubmitJob", request, admin_pb2.JobInfo)

    async def list_jobs(self, *, include_all: bool = False) -> admin_pb2.ListJobsResponse:
        req = admin_pb2.ListJobsRequest(include_all=include_all)
        return await self._unary("ListJobs", req, admin_pb2.ListJobsResponse)

    async def get_job(self, dag_id: str) -> admin_pb2.JobInfo:
        return await self._unary("GetJob", admin_pb2.GetJobRequest(dag_id=dag_id), admin_pb2.JobInfo)

    async def cancel_job(self, dag_id: str) -> admin_pb2.CancelJobResponse:
        req = admin_pb2.CancelJobRequest(dag_id=dag_id)
        return await self._unary("CancelJob", req, admin_pb2.CancelJobResponse)

    async def job_slots(self, capacities: dict[str, int] | None = None) -> admin_pb2.JobSlotsResponse:
        req = admin_pb2.JobSlotsRequest(capacities=capacities or {})
        return await self._unary("JobSlots", req, admin_pb2.JobSlotsResponse)

    async def get_health(self) -> admin_pb2.HealthInfo:
        return await self._unary("GetHealth", admin_pb2.GetHealthRequest(), admin_pb2.HealthInfo)

    # -- tunnels (the `Tunnels` service on the same channel: docs/access.md) ---------------------------------

    async def list_tunnels(self, *, node_id: str = "", open_only: bool = False) -> list[tunnel_pb2.TunnelRecord]:
        from bc.protocol.pb import tunnel_pb2  # the tunnels' own service: loaded by the commands that call it
        from bc.wire.stubs import tunnel_pb2_grpc

        req = tunnel_pb2.ListTunnelsRequest(node_id=node_id, open_only=open_only)
        try:
            resp = await tunnel_pb2_grpc.TunnelsStub(self._channel).ListTunnels(req, timeout=self._timeout_s)
        except grpc.aio.AioRpcError as e:
            raise await self._error(e) from e
        return list(self._check(resp, tunnel_pb2.ListTunnelsResponse).tunnels)

    async def close_tunnel(self, sid: str, *, reason: str = "") -> tunnel_pb2.TunnelRecord:
        from bc.protocol.pb import tunnel_pb2
        from bc.wire.stubs import tunnel_pb2_grpc

        req = tunnel_pb2.CloseTunnelRequest(sid=sid, reason=reason)
        try:
            resp = await tunnel_pb2_grpc.TunnelsStub(self._channel).CloseTunnel(req, timeout=self._timeout_s)
        except grpc.aio.AioRpcError as e:
            raise await self._error(e) from e
        return self._check(resp, tunnel_pb2.TunnelRecord)

    async def get_health_policy(self) -> admin_pb2.HealthPolicyInfo:
        return await self._unary("GetHealthPolicy", admin_pb2.GetHealthPolicyRequest(), admin_pb2.HealthPolicyInfo)

    async def set_health_policy(self, policy_json: str, reason: str = "") -> admin_pb2.HealthPolicyInfo:
        req = admin_pb2.SetHealthPolicyRequest(policy_json=policy_json, reason=reason)
        return await self._unary("SetHealthPolicy", req, admin_pb2.HealthPolicyInfo)

    # -- bare metal (docs/metal.md) -----------------------------------------------------------------
    async def enroll_machine(self, req: metal_pb2.EnrollMachineRequest) -> metal_pb2.EnrollMachineResponse:
        return await self._unary("EnrollMachine", req, metal_pb2.EnrollMachineResponse)

    async def list_machines(self) -> metal_pb2.ListMachinesResponse:
        return await self._unary("ListMachines", metal_pb2.ListMachinesRequest(), metal_pb2.ListMachinesResponse)

    async def get_machine(self, name: str) -> metal_pb2.MachineInfo:
        return await self._unary("GetMachine", metal_pb2.GetMachineRequest(name=name), metal_pb2.MachineInfo)

    async def remove_machine(self, name: str) -> metal_pb2.RemoveMachineResponse:
        req = metal_pb2.RemoveMachineRequest(name=name)
        return await self._unary("RemoveMachine", req, metal_pb2.RemoveMachineResponse)

    async def provision_machines(self, req: metal_pb2.ProvisionMachinesRequest) -> admin_pb2.JobInfo:
        return await self._unary("ProvisionMachines", req, admin_pb2.JobInfo)

    # -- secrets (docs/secrets.md) -----------------------------------------------------------------
    async def set_secret(
        self, name: str, value: bytes, nodes: Sequence[str] = (), labels: Sequence[str] = ()
    ) -> secrets_pb2.SecretInfo:
        """A new version of `name`; without nodes or labels the secret keeps its scope."""
        req = secrets_pb2.SetSecretRequest(
            name=name,
            value=value,
            scope=secrets_pb2.SecretScope(nodes=list(nodes), labels=list(labels)),
            set_scope=bool(nodes or labels),
        )
        return await self._unary("SetSecret", req, secrets_pb2.SecretInfo)

    async def list_secrets(self) -> secrets_pb2.ListSecretsResponse:
        return await self._unary("ListSecrets", secrets_pb2.ListSecretsRequest(), secrets_pb2.ListSecretsResponse)

    async def remove_secret(self, name: str) -> secrets_pb2.SecretInfo:
        return await self._unary("RemoveSecret", secrets_pb2.RemoveSecretRequest(name=name), secrets_pb2.SecretInfo)

    async def secret_versions(self, name: str) -> secrets_pb2.ListSecretVersionsResponse:
        req = secrets_pb2.ListSecretVersionsRequest(name=name)
        return await self._unary("ListSecretVersions", req, secrets_pb2.ListSecretVersionsResponse)

    async def cordon_gpu(self, node_id: str, gpu: str, reason: str) -> admin_pb2.GpuCordonChange:
        req = admin_pb2.CordonGpuRequest(node_id=node_id, gpu=gpu, reason=reason)
        return await self._unary("CordonGpu", req, admin_pb2.GpuCordonChange)

    async def return_gpu(self, node_id: str, gpu: str, reason: str = "") -> admin_pb2.GpuCordonChange:
        req = admin_pb2.ReturnGpuRequest(node_id=node_id, gpu=gpu, reason=reason)
        return await self._unary("ReturnGpu", req, admin_pb2.GpuCordonChange)

    async def watch_job(self, dag_id: str) -> AsyncGenerator[admin_pb2.JobInfo, None]:
        """The DAG now, then at each change; the stream ends after the terminal one. No deadline, like `watch`."""
        call = self._call("WatchJob")(admin_pb2.GetJobRequest(dag_id=dag_id))
        try:
            async for info in call:
                yield self._check(info, admin_pb2.JobInfo)
        except grpc.aio.AioRpcError as e:
            raise await self._error(e) from e
        finally:
            call.cancel()

    # -- break-glass SSH (docs/ssh.md) ----------------------------------------------

    async def ssh_ca_init(self, *, public_key: str = "") -> admin_pb2.SshCaInfo:
        req = admin_pb2.SshCaInitRequest(public_key=public_key)
        return await self._unary("SshCaInit", req, admin_pb2.SshCaInfo)

    async def get_ssh_ca(self) -> admin_pb2.SshCaInfo:
        return await self._unary("GetSshCa", admin_pb2.GetSshCaRequest(), admin_pb2.SshCaInfo)

    async def ssh_grant(self, request: admin_pb2.SshGrantRequest) -> admin_pb2.SshGrantInfo:
        return await self._unary("SshGrant", request, admin_pb2.SshGrantInfo)

    async def get_ssh_grant(self, *, serial: int = 0, batch_id: str = "") -> admin_pb2.SshGrantInfo:
        req = admin_pb2.GetSshGrantRequest(serial=serial, batch_id=batch_id)
        return await self._unary("GetSshGrant", req, admin_pb2.SshGrantInfo)

    async def list_ssh_grants(self, *, node_id: str = "", live_only: bool = False) -> list[admin_pb2.SshGrantInfo]:
        req = admin_pb2.ListSshGrantsRequest(node_id=node_id, live_only=live_only)
        return list((await self._unary("ListSshGrants", req, admin_pb2.ListSshGrantsResponse)).grants)

    async def ssh_record_cert(self, serial: int, certificate: str) -> admin_pb2.SshGrantInfo:
        req = admin_pb2.SshRecordCertRequest(serial=serial, certificate=certificate)
        return await self._unary("SshRecordCert", req, admin_pb2.SshGrantInfo)

    async def ssh_revoke(self, serial: int, *, reason: str = "") -> admin_pb2.SshGrantInfo:
        req = admin_pb2.SshRevokeRequest(serial=serial, reason=reason)
        return await self._unary("SshRevoke", req, admin_pb2.SshGrantInfo)

    # -- self-update (docs/self-update.md) -----------------------------------------

    async def add_release_key(self, public_key: bytes) -> admin_pb2.ReleaseKeyInfo:
        req = admin_pb2.AddReleaseKeyRequest(public_key=public_key)
        return await self._unary("AddReleaseKey", req, admin_pb2.ReleaseKeyInfo)

    async def list_releases(self, name: str = "") -> admin_pb2.ListReleasesResponse:
        """Every release, key and node upgrade; `next_sequence` is the next of release `name` (empty: bc)."""
        request = admin_pb2.ListReleasesRequest(name=name)
        return await self._unary("ListReleases", request, admin_pb2.ListReleasesResponse)

    async def publish_release(
        self, header: admin_pb2.PublishReleaseChunk, path: Path | None, *, timeout_s: float = 600.0
    ) -> admin_pb2.ReleaseInfo:
        """Stream the header, then the file (if any) in 1 MiB chunks read off the loop."""

        async def chunks() -> AsyncIterator[admin_pb2.PublishReleaseChunk]:
            yield header
            if path is None:
                return
            with path.open("rb") as f:
                while data := await asyncio.to_thread(f.read, RELEASE_CHUNK):
                    yield admin_pb2.PublishReleaseChunk(data=data)

        try:
            resp = await self._call("PublishRelease")(chunks(), timeout=timeout_s)
        except grpc.aio.AioRpcError as e:
            raise await self._error(e) from e
        return self._check(resp, admin_pb2.ReleaseInfo)

    # -- events and the server ----------------------------------------------------

    async def list_events(
        self, *, after_seq: int = 0, limit: int = 0, type_prefix: str = ""
    ) -> list[admin_pb2.EventRecord]:
        req = admin_pb2.ListEventsRequest(after_seq=after_seq, limit=limit, type_prefix=type_prefix)
        resp = await self._unary("ListEvents", req, admin_pb2.ListEventsResponse)
        return list(resp.events)

    async def watch(self, *, after_seq: int = 0, type_prefix: str = "") -> AsyncGenerator[admin_pb2.EventRecord, None]:
        """Events after `after_seq`, then each new one as it is published, until the caller stops.

        The one call without a deadline: a follow runs as long as the operator wants it to.
        """
        call = self._call("Watch")(admin_pb2.WatchRequest(after_seq=after_seq, type_prefix=type_prefix))
        try:
            async for event in call:
                yield self._check(event, admin_pb2.EventRecord)
        except grpc.aio.AioRpcError as e:
            raise await self._error(e) from e
        finally:
            call.cancel()

    async def drain(self, over_s: int) -> admin_pb2.DrainResponse:
        return await self._unary("Drain", admin_pb2.DrainRequest(over_s=over_s), admin_pb2.DrainResponse)

    async def server_info(self) -> admin_pb2.ServerInfoResponse:
        return await self._unary("ServerInfo", admin_pb2.ServerInfoRequest(), admin_pb2.ServerInfoResponse)

    # -- plumbing -------------------------------------------------------------------

    async def _unary(
        self, rpc: str, request: Message, reply: type[_Reply], *, timeout_s: float | None = None
    ) -> _Reply:
        method = self._call(rpc)
        try:
            resp = await self._sent(method, request, timeout_s or self._timeout_s)
        except grpc.aio.AioRpcError as e:
            details = e.details() or ""
            if is_write(rpc) and broke_mid_call(e.code(), details):
                raise Unavailable(
                    f"bc serve at {self.server} stopped answering during the call ({_reason(e.code(), details)});"
                    f" it may have been applied; check with `{WRITE_CHECKS.get(rpc, 'bc events')}`"
                ) from e
            raise await self._error(e) from e
        return self._check(resp, reply)

    async def _sent(self, method: Any, request: Message, timeout_s: float) -> Any:
        """`method(request)`, sent again while no connection could be made (see `CONNECT_RETRY_PAUSES_S`)."""
        for pause_s in (*CONNECT_RETRY_PAUSES_S, None):
            try:
                return await method(request, timeout=timeout_s)
            except grpc.aio.AioRpcError as e:
                if pause_s is None or not never_connected(e.code(), e.details() or ""):
                    raise
            await asyncio.sleep(pause_s)
        raise AssertionError("unreachable: the last attempt raises or returns")

    async def _error(self, e: grpc.aio.AioRpcError) -> BcError:
        """Our error for a failed call. A connection closed during the handshake is either a server going
        away or one refusing the operator's certificate: a TLS handshake of our own tells which."""
        details = e.details() or ""
        err = status_to_error(e.code(), details, server=self.server)
        low = details.lower()
        if isinstance(err, Unavailable) and "failed to connect" in low and "socket closed" in low:
            alert = await refused_certificate(self._config)
            if alert is not None:
                return Unauthenticated(
                    f"bc serve at {self.server} refused the operator certificate ({alert});"
                    " is the operator config this cluster's, and the operator not revoked?"
                )
        return err

    def _call(self, rpc: str) -> Any:
        if self._calls is None and self._closed:
            # A caller that holds the client across its close (a TUI screen's read while the feed drops the
            # connection to reconnect): the server is away for that caller, as if the call had been refused.
            # A RuntimeError here crashed `bc tui` when a node's screen was reading as `bc serve` went away.
            raise Unavailable(f"bc serve at {self.server} is not answering (the connection was closed)")
        if self._calls is None:
            raise RuntimeError("AdminClient is used outside `async with`")
        return self._calls[rpc]

    @staticmethod
    def _check(resp: object, reply: type[_Reply]) -> _Reply:
        if not isinstance(resp, reply):
            raise ProtocolError(f"the server answered with {type(resp).__name__}, not {reply.__name__}")
        return resp
