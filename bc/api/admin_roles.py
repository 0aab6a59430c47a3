"""Who may call what on the Admin service: one table of RPC → minimum role, and the guard around every RPC.

Every RPC the service declares is wrapped (`guarded`) before its body runs:
the client certificate must be an operator's, issued by this server to a live
operator (`bc.control.operators.authorize`), whose role is at least the one
`ROLE_NEEDED` names for the RPC; an RPC missing from the table needs admin
(fail closed); `REQUEST_ROLE` may raise it for some requests (a job that
cordons is admin's, as `CordonNode` is). A refusal is UNAUTHENTICATED (exit 6) with a sentence naming
the role needed. A unary body then runs acting for that operator
(`bc.control.actor`), so every event it publishes names who made the write.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol, TypeVar

import grpc

from bc.control import actor, operators
from bc.errors import BcError
from bc.protocol.pb import admin_pb2
from bc.wire.status import abort_with

VIEWER, OPERATOR, ADMIN = operators.ROLES

ROLE_NEEDED: dict[str, tuple[str, str]] = {
    # viewer: List, Get and Watch — the TUI on a shared screen.
    "ListNodes": (VIEWER, "listing nodes"),
    "GetNode": (VIEWER, "showing a node"),
    "GetSpec": (VIEWER, "showing a spec"),
    "ListReservations": (VIEWER, "listing reservations"),
    "GetReservation": (VIEWER, "reading a reservation"),
    "GetPlacementExplanation": (VIEWER, "reading why a reservation waits"),
    "GetUsage": (VIEWER, "reading usage"),
    "ListEvents": (VIEWER, "listing events"),
    "Watch": (VIEWER, "watching events"),
    "ServerInfo": (VIEWER, "asking the server who it is"),
    "GetCommand": (VIEWER, "showing a command"),
    "ListCommands": (VIEWER, "listing commands"),
    "GetPki": (VIEWER, "showing the PKI"),
    "ListApprovers": (VIEWER, "listing approvers"),
    "ListBatches": (VIEWER, "listing batches"),
    "GetBatch": (VIEWER, "showing a batch"),
    "ListQuorumChanges": (VIEWER, "listing quorum changes"),
    "GetQuorumChange": (VIEWER, "showing a quorum change"),
    "ListOperators": (VIEWER, "listing operators"),
    "ListJobs": (VIEWER, "listing jobs"),
    "GetJob": (VIEWER, "showing a job"),
    "WatchJob": (VIEWER, "watching a job"),
    "GetSshCa": (VIEWER, "showing the SSH CA"),
    "ListSshGrants": (VIEWER, "listing SSH certificates"),
    "ListReleases": (VIEWER, "listing releases"),
    # operator: also reservations, commands, specs, batches, approving and rejecting.
    # A root-equivalent change needs admin and, once approvers exist, their quorum: the table is
    # bc.protocol.root_equiv (the node applies it too), the check bc.control.spec_quorum.
    "SetSpecSection": (OPERATOR, "setting a spec section"),
    "Reserve": (OPERATOR, "reserving GPUs"),
    "Release": (OPERATOR, "releasing a reservation"),
    "RunCommand": (OPERATOR, "running a command"),
    "EnqueueCommands": (OPERATOR, "running commands"),
    "CancelCommand": (OPERATOR, "cancelling a command"),
    "CreateBatch": (OPERATOR, "creating a batch"),
    "ApproveBatch": (OPERATOR, "approving a batch"),
    "RejectBatch": (OPERATOR, "rejecting a batch"),
    "ApproveQuorumChange": (OPERATOR, "approving a quorum change"),
    "RejectQuorumChange": (OPERATOR, "rejecting a quorum change"),
    "SubmitJob": (OPERATOR, "running a job"),  # cordon and uncordon need admin: see REQUEST_ROLE
    "CancelJob": (OPERATOR, "cancelling a job"),
    "SshGrant": (OPERATOR, "granting SSH access"),
    "GetSshGrant": (OPERATOR, "fetching an SSH certificate"),  # it may sign one its batch's quorum approved
    "SshRevoke": (OPERATOR, "revoking an SSH certificate"),
    "SshRecordCert": (OPERATOR, "recording an SSH certificate"),
    # admin: also tokens, node revoke/delete/cordon, approvers, operators and the PKI.
    "CreateToken": (ADMIN, "creating a join token"),
    "RevokeNode": (ADMIN, "revoking a node"),
    "CordonNode": (ADMIN, "cordoning a node"),
    "LabelNode": (ADMIN, "labelling a node"),
    "DeleteNode": (ADMIN, "deleting a node"),
    "RotateSigningKey": (ADMIN, "rotating the signing key"),
    "AddApprover": (ADMIN, "adding an approver"),
    "RemoveApprover": (ADMIN, "removing an approver"),
    "SetApproverThreshold": (ADMIN, "setting the approver threshold"),
    "SetUnbatchedAllowance": (ADMIN, "setting the unbatched allowance"),
    "AddOperator": (ADMIN, "adding an operator"),
    "RevokeOperator": (ADMIN, "revoking an operator"),
    "SshCaInit": (ADMIN, "making the SSH CA"),
    "Drain": (ADMIN, "draining a gateway"),
    # What every node will run: the release key and the releases it signs are admin's.
    "AddReleaseKey": (ADMIN, "adding a release key"),
    "PublishRelease": (ADMIN, "publishing a release"),
    # The global pools bound every operator's DAGs (how many nodes reboot at once, fleet-wide), like a
    # safety setting; an operator narrows a run of their own with --max-parallel / --max-unavailable.
    "JobSlots": (ADMIN, "setting job slot pools"),
}
"""Each Admin RPC's minimum role and what it does, for the refusal's sentence. Missing: admin (fail closed)."""


def _submit_job_role(request: Any) -> tuple[str, str] | None:
    """A job that sets a node's wanted schedulability is a cordon, which is admin's whatever the route."""
    template = getattr(request, "template", "")
    if template == "cordon":
        return ADMIN, "cordoning a node"
    if template == "uncordon":
        return ADMIN, "uncordoning a node"
    return None


REQUEST_ROLE: dict[str, Callable[[Any], tuple[str, str] | None]] = {"SubmitJob": _submit_job_role}
"""RPCs whose request may need more than `ROLE_NEEDED` says: the stricter of the two applies."""


class Guarded(Protocol):
    """What the guard needs of the servicer: who the caller is, or a refusal."""

    async def _caller(self, context: grpc.aio.ServicerContext, need: str, what: str) -> operators.Caller: ...


S = TypeVar("S", bound=Guarded)


def needed(rpc: str, request: Any = None) -> tuple[str, str]:
    """The role `rpc` needs (for `request`, when its arguments raise it) and what the call does."""
    base = ROLE_NEEDED.get(rpc, (ADMIN, f"calling {rpc}"))
    refine = REQUEST_ROLE.get(rpc)
    stricter = refine(request) if refine is not None and request is not None else None
    if stricter is not None and operators.RANK[stricter[0]] >= operators.RANK[base[0]]:
        return stricter
    return base


def _guard(rpc: str, fn: Any, streaming: bool) -> Any:
    """`fn` (an RPC method) behind the caller check; the body acts for the caller."""
    if streaming:

        @functools.wraps(fn)
        async def stream(self: Guarded, request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            try:
                await self._caller(context, *needed(rpc, request))
            except BcError as e:
                await abort_with(context, e)
            # A stream writes nothing, so it needs no operator to act for.
            async for item in fn(self, request, context):
                yield item

        return stream

    @functools.wraps(fn)
    async def unary(self: Guarded, request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            caller = await self._caller(context, *needed(rpc, request))
        except BcError as e:
            await abort_with(context, e)
        with actor.acting(caller.name):
            return await fn(self, request, context)

    return unary


def guarded(cls: type[S]) -> type[S]:
    """Every RPC the Admin service declares goes through `_guard`, whether or not the table names it."""
    for method in admin_pb2.DESCRIPTOR.services_by_name["Admin"].methods:
        setattr(cls, method.name, _guard(method.name, getattr(cls, method.name), method.server_streaming))
    return cls
