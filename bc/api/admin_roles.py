"""Who may call what on the Admin service: one table of RPC → minimum role, and the guard around every RPC.

Every RPC the service declares is wrapped (`guarded`) before its body runs:
the client certificate must be an operator's, issued by this server to a live
operator (`bc.control.trust.operators.authorize`), whose role is at least the one
`ROLE_NEEDED` names for the RPC; an RPC missing from the table needs admin
(fail closed); `REQUEST_ROLE` may raise it for some requests: a command, a
fan-out or a batch needs its kind's role (`KIND_ROLE`), and a job the role of its
most privileged step, each step checked as the direct call with the same effect
(a `drain` job cordons, so it is admin's as `CordonNode` is). `OTHERS_NEED` is
what a body asks when the caller acts on another operator's work (cancelling
their job). A refusal is UNAUTHENTICATED (exit 6) with a sentence naming
the role needed. A unary body then runs acting for that operator
(`bc.control.base.actor`), so every event it publishes names who made the write.

A stream (`Watch`, `WatchJob`) is checked again after event wake-ups (at most
every `EVENT_GAP_S`, so a burst of events costs one check) and at least every
`RECHECK_S`: once its operator is revoked or their role is lowered,
it ends UNAUTHENTICATED with the reason, so a revoked key stops seeing the fleet
within seconds rather than whenever the client hangs up.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any, Protocol, TypeVar

import grpc
from google.protobuf.descriptor import ServiceDescriptor

from bc.api import job_views
from bc.control.base import actor
from bc.control.base.bus import Bus
from bc.errors import BcError, Unauthenticated
from bc.jobs import templates
from bc.jobs.model import DagSpec, NodeSpec
from bc.pki.identity import PeerIdentity
from bc.protocol.pb import admin_pb2
from bc.wire.status import abort_with

VIEWER, OPERATOR, ADMIN = actor.ROLES

ROLE_NEEDED: dict[str, tuple[str, str]] = {
    # viewer: List, Get and Watch — the TUI on a shared screen.
    "ListNodes": (VIEWER, "listing nodes"),
    "ListNodesStream": (VIEWER, "listing nodes"),
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
    "GetHealth": (VIEWER, "reading the fleet's health"),
    "GetHealthPolicy": (VIEWER, "reading the health policy"),
    # operator: also reservations, commands, specs, batches, approving and rejecting.
    # A root-equivalent change needs admin and, once approvers exist, their quorum: the table is
    # bc.protocol.root_equiv (the node applies it too), the check bc.control.quorum.spec_changes.
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
    "SubmitJob": (OPERATOR, "running a job"),  # a job needs its most privileged step's role: see REQUEST_ROLE
    "CancelJob": (OPERATOR, "cancelling a job"),
    "SshGrant": (OPERATOR, "granting SSH access"),
    "GetSshGrant": (OPERATOR, "fetching an SSH certificate"),  # it may sign one its batch's quorum approved
    "SshRevoke": (OPERATOR, "revoking an SSH certificate"),
    "SshRecordCert": (OPERATOR, "recording an SSH certificate"),
    # One GPU in or out of placement (never a hold released): narrower than a node's cordon (admin's, it
    # takes a whole machine from every tenant), and what an operator who may already reset the GPU
    # (`gpu.reset`) needs to finish the job a quarantine left "for a person" (docs/health.md).
    "CordonGpu": (OPERATOR, "cordoning a GPU"),
    "ReturnGpu": (OPERATOR, "returning a GPU to placement"),
    # Secrets (docs/secrets.md): the names, scopes and who set them, never a value; not a shared screen's.
    "ListSecrets": (OPERATOR, "listing secrets"),
    "ListSecretVersions": (OPERATOR, "listing a secret's versions"),
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
    "WithdrawQuorumChange": (ADMIN, "withdrawing a quorum change"),  # and only its proposer (an admin)
    "AddOperator": (ADMIN, "adding an operator"),
    "RevokeOperator": (ADMIN, "revoking an operator"),
    "SetOperatorRole": (ADMIN, "changing an operator's role"),
    "SshCaInit": (ADMIN, "making the SSH CA"),
    "Drain": (ADMIN, "draining a gateway"),
    # What every node will run: the release key and the releases it signs are admin's.
    "AddReleaseKey": (ADMIN, "adding a release key"),
    "PublishRelease": (ADMIN, "publishing a release"),
    # The global pools bound every operator's DAGs (how many nodes reboot at once, fleet-wide), like a
    # safety setting; an operator narrows a run of their own with --max-parallel / --max-unavailable.
    "JobSlots": (ADMIN, "setting job slot pools"),
    # What the health reconciler may do to the fleet on its own (which conditions reset or quarantine a GPU,
    # how many nodes at once): a fleet-wide safety setting like the slot pools.
    "SetHealthPolicy": (ADMIN, "setting the health policy"),
    # A secret is a credential nodes act with (a collector's token, a cluster's join token): admin's.
    "SetSecret": (ADMIN, "setting a secret"),
    "RemoveSecret": (ADMIN, "removing a secret"),
    # Tunnels (service `Tunnels`, docs/access.md): an operator reaches a node's loopback with a ticket of
    # their own (`IssueTicket`, each purpose's role in PURPOSE_ROLE), then opens it; anyone may list them;
    # closing another operator's tunnel or rotating the ticket key is admin's.
    "ListTunnels": (VIEWER, "listing tunnels"),
    "IssueTicket": (OPERATOR, "asking for an exec ticket"),
    "Open": (OPERATOR, "opening a tunnel"),
    "CloseTunnel": (ADMIN, "closing a tunnel"),
    "RotateTicketKey": (ADMIN, "rotating the exec-ticket key"),
    # Shell typescripts: anyone may read the policy (a `bc shell` follows it); setting it and reading a
    # typescript (what was typed and shown on a node) is admin's (there is no auditor role); an operator uploads
    # only the typescripts of their own tunnels (checked against the record, bc.control.trust.typescripts).
    "GetRecordPolicy": (VIEWER, "reading the record policy"),
    "SetRecordPolicy": (ADMIN, "setting the record policy"),
    "UploadTypescript": (OPERATOR, "uploading a typescript"),
    "GetTypescript": (ADMIN, "reading a typescript"),
    # Bare metal (docs/metal.md): a machine's BMC URL and MACs in a site section are root-equivalent (the
    # site sends that BMC's credentials there; its MACs get a ramdisk's join token), and provisioning wipes
    # disks and installs an OS: admin's. Anyone may read the machines and their provisioning state.
    "ListMachines": (VIEWER, "listing machines"),
    "GetMachine": (VIEWER, "showing a machine"),
    "EnrollMachine": (ADMIN, "enrolling a machine"),
    "RemoveMachine": (ADMIN, "removing a machine"),
    "ProvisionMachines": (ADMIN, "provisioning machines"),
}
"""Each Admin RPC's minimum role and what it does, for the refusal's sentence. Missing: admin (fail closed)."""

PROCESS_ONLY: dict[str, tuple[str, str]] = {
    # Between control-plane processes (service `GatewayTunnels`, bc.api.tunnel_route): an api relays an operator's
    # tunnel through the gateway that holds the node's session. No operator role reaches it: the caller must
    # present a control-plane process certificate (`gateway:<id>`: a gateway's, or an api process's own).
    "Relay": ("gateway", "relaying a tunnel between control-plane processes"),
}
"""The RPCs only a control-plane process may call: the certificate kind each needs (`bc.pki.identity`), and what
it does. With `ROLE_NEEDED` this is the one table of who may call what; no name is in both."""


KIND_ROLE: dict[str, str] = {
    # What changes the software, firmware, disks, boot path or credentials of a machine is admin's, like
    # the release key and releases (`PublishRelease`): a stolen operator key must not make a node run code.
    "daemon.upgrade": ADMIN,
    "driver.invoke": ADMIN,
    "deploy.image": ADMIN,
    "disk.wipe": ADMIN,
    "boot.kexec": ADMIN,
    "boot.prepareRamdisk": ADMIN,
    "bmc.boot": ADMIN,
    "bmc.firmware": ADMIN,
    "bmc.storage": ADMIN,
    "bmc.rotate": ADMIN,
    "site.httpProxy": ADMIN,
    # Reading, resetting, rebooting and collecting are an operator's (the destructive ones behind the quorum).
    "inventory.refresh": OPERATOR,
    "diag.nvml": OPERATOR,
    "diag.dcgm": OPERATOR,
    "gpu.reset": OPERATOR,
    "node.reboot": OPERATOR,
    "bmc.query": OPERATOR,
    "bmc.power": OPERATOR,
    "boot.cleanUp": OPERATOR,
    "logs.collect": OPERATOR,
    "instance.snapshot": OPERATOR,
}
"""Each command kind's minimum role, whether run alone, fanned out, in a batch or as a job's step.
Every kind of `bc.protocol.kinds` is here (a test walks them); an unknown kind is refused by the body."""


def _kind_role(kind: str, doing: str) -> tuple[str, str] | None:
    role = KIND_ROLE.get(kind)
    return None if role is None else (role, f"{doing} {kind[:64]}")


def _run_command_role(request: Any) -> tuple[str, str] | None:
    return _kind_role(getattr(request, "kind", ""), "running")


def _enqueue_role(request: Any) -> tuple[str, str] | None:
    """The most privileged kind among the commands: one admin kind makes the call admin's."""
    found = [r for r in (_run_command_role(c) for c in getattr(request, "commands", ())) if r is not None]
    return max(found, key=lambda r: actor.RANK[r[0]], default=None)


def _batch_role(request: Any) -> tuple[str, str] | None:
    return _kind_role(getattr(request, "kind", ""), "creating a batch of")


STEP_ROLE: dict[str, tuple[str, str]] = {
    # A job's own bookkeeping: it holds and releases its subject for its run, groups, reports.
    "Drain": (OPERATOR, "holding a node out of placement for a job"),
    "Reconcile": (OPERATOR, "releasing a job's hold on a node"),
    "Group": (OPERATOR, "grouping a job's steps"),
    "Emit": (OPERATOR, "reporting a job's outcome"),
    "ResolveApproval": (OPERATOR, "closing a job's batch"),
    # A provisioning job's steps (bc.jobs.metal_steps): BMC power and boot, disk wipe, image deploy, kexec.
    "MetalCommand": (ADMIN, "provisioning a machine"),
    "MetalJoin": (ADMIN, "provisioning a machine"),
    "MetalInventory": (ADMIN, "provisioning a machine"),
    "MetalSettle": (ADMIN, "provisioning a machine"),
    "MetalBulk": (ADMIN, "asking for a provisioning job's quorum"),
}
"""Job steps with no direct call of their own; every other step is checked as the call it makes
(`step_needed`). A step kind in neither needs admin (fail closed)."""


def step_needed(step: NodeSpec) -> tuple[str, str]:
    """The role a job step needs: that of the direct call with the same effect (a job is no way around it)."""
    p = step.params
    if step.kind == "SetWanted":  # the node's durable wanted state: a cordon or uncordon, as `CordonNode`
        cordon = bool(p.get("cordoned"))
        return needed("CordonNode")[0], "cordoning a node" if cordon else "uncordoning a node"
    if step.kind == "Command":
        return needed("RunCommand", admin_pb2.RunCommandRequest(node_id=step.subject or "", kind=str(p.get("kind"))))
    if step.kind == "Batch":
        return needed("CreateBatch", admin_pb2.CreateBatchRequest(kind=str(p.get("kind"))))
    if step.kind == "PatchSpec":
        section = admin_pb2.SetSpecSectionRequest(
            node_id=step.subject or "", section=str(p.get("section")), section_json=str(p.get("section_json") or "")
        )
        return needed("SetSpecSection", section)
    return STEP_ROLE.get(step.kind, (ADMIN, f"a job step {step.kind}"))


def job_needed(dag: DagSpec) -> tuple[str, str]:
    """A job needs the role of its most privileged step (and at least `SubmitJob`'s)."""
    need = ROLE_NEEDED["SubmitJob"]
    for step in dag.nodes:
        role, what = step_needed(step)
        if actor.RANK[role] > actor.RANK[need[0]]:
            article = "an" if dag.template[:1] in "aeiou" else "a"
            need = (role, f"running {article} {dag.template} job: {what}")
    return need


def _submit_job_role(request: Any) -> tuple[str, str] | None:
    """The job the request would build, with every optional step in (approvers, GPUs): its steps' roles.

    Built for its first subject only (every subject gets the same steps). The facts are the most permissive
    the request allows (its nodes exist, approvers exist, its GPUs are the node's), so a request that cannot
    build here cannot build in the body either: it gets no refinement, and the body refuses it with a
    UsageError, NotFound or Conflict before anything is stored.
    """
    try:
        req = job_views.job_request(request)
        first = req.nodes[:1] or ("role-check",)
        req = dataclasses.replace(req, nodes=first)
        gpus = req.gpus or ("GPU-role-check",)
        facts = templates.Facts(frozenset(first), has_approvers=True, gpus={n: gpus for n in first})
        dag = templates.build(req, "j-role-check", facts)
    except BcError:
        return None
    return job_needed(dag)


PURPOSE_ROLE: dict[str, str] = {
    "forward": OPERATOR,
    "exec": OPERATOR,
    "shell": OPERATOR,
}
"""Each exec-ticket purpose's minimum role (bc.pki.exec_tickets.PURPOSES); an unknown purpose is refused by the body."""


def _ticket_role(request: Any) -> tuple[str, str] | None:
    purpose = str(getattr(request, "purpose", ""))
    role = PURPOSE_ROLE.get(purpose)
    return None if role is None else (role, f"asking for a {purpose[:16]} ticket")


REQUEST_ROLE: dict[str, Callable[[Any], tuple[str, str] | None]] = {
    "IssueTicket": _ticket_role,
    "SubmitJob": _submit_job_role,
    "RunCommand": _run_command_role,
    "EnqueueCommands": _enqueue_role,
    "CreateBatch": _batch_role,
}
"""RPCs whose request may need more than `ROLE_NEEDED` says: the stricter of the two applies."""

OTHERS_NEED: dict[str, tuple[str, str]] = {
    "CancelJob": (ADMIN, "cancelling another operator's job"),
}
"""What an RPC needs when it acts on what another operator made (the body checks the owner)."""


class Guarded(Protocol):
    """What the guard needs of the servicer: who the caller is, or a refusal; and the events' wake-up."""

    bus: Bus

    def _identity(self, context: grpc.aio.ServicerContext) -> PeerIdentity: ...

    async def _authorize(self, peer: PeerIdentity, need: str, what: str) -> actor.Caller: ...

    async def _caller(self, context: grpc.aio.ServicerContext, need: str, what: str) -> actor.Caller: ...


RECHECK_S = 1.0
"""A stream's caller is checked again at each event wake-up and at least this often (revocation ends it
within about this long even when the revocation's event came through another process without a relay)."""


S = TypeVar("S", bound=Guarded)
T = TypeVar("T")


def needed(rpc: str, request: Any = None) -> tuple[str, str]:
    """The role `rpc` needs (for `request`, when its arguments raise it) and what the call does."""
    base = ROLE_NEEDED.get(rpc, (ADMIN, f"calling {rpc}"))
    refine = REQUEST_ROLE.get(rpc)
    stricter = refine(request) if refine is not None and request is not None else None
    if stricter is not None and actor.RANK[stricter[0]] > actor.RANK[base[0]]:
        return stricter
    return base


async def _first_refusal(
    check: Callable[[], Awaitable[actor.Caller]], wake: Callable[[float], Awaitable[None]], was: actor.Caller
) -> BcError:
    """Wait until the caller a stream was opened for may no longer have it: revoked, or role lowered."""
    while True:
        await wake(RECHECK_S)
        try:
            now = await check()
        except Unauthenticated as e:
            return e
        except BcError:
            continue  # the store hiccupped: the stream itself will say so, or the next check decides
        if actor.RANK[now.role] < actor.RANK[was.role]:
            return Unauthenticated(
                f"operator {now.name}'s role was lowered from {was.role} to {now.role}; this stream is closed:"
                f" reconnect to go on as a {now.role}"
            )


async def _while_allowed(items: AsyncIterator[T], refused: asyncio.Task[BcError]) -> AsyncGenerator[T, None]:
    """`items` until they end or `refused` finishes first (then its error is raised)."""
    nxt: asyncio.Future[T] | None = None
    try:
        while True:
            nxt = asyncio.ensure_future(anext(items))
            await asyncio.wait({nxt, refused}, return_when=asyncio.FIRST_COMPLETED)
            if not nxt.done():
                raise refused.result()
            try:
                item = nxt.result()
            except StopAsyncIteration:
                return
            nxt = None
            yield item
    finally:
        # The client went away, the caller was refused, or the stream ended: stop the pending read
        # before closing the generator it is inside, and the check beside it.
        for task in (nxt, refused):
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        aclose = getattr(items, "aclose", None)
        if aclose is not None:
            await aclose()


def _guard(rpc: str, fn: Any, streaming: bool) -> Any:
    """`fn` (an RPC method) behind the caller check; the body acts for the caller."""
    if streaming:

        @functools.wraps(fn)
        async def stream(self: Guarded, request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            need = needed(rpc, request)
            try:
                peer = self._identity(context)
                caller = await self._authorize(peer, *need)
            except BcError as e:
                await abort_with(context, e)
            # A stream writes nothing, so it needs no operator to act for; it lives while its caller may.
            # The recheck asks the store about the certificate read at the start, never the call's context
            # again: grpc's auth context of a call that ended under it is freed memory (a segfault).
            refused = asyncio.ensure_future(
                _first_refusal(lambda: self._authorize(peer, *need), self.bus.wait_events_spaced, caller)
            )
            try:
                # Closed explicitly when the call ends (the client went away): left to the garbage collector, the
                # body's generator (a tunnel's relay) could outlive its call for as long as a reference cycle lasts.
                async with contextlib.aclosing(_while_allowed(fn(self, request, context), refused)) as items:
                    async for item in items:
                        yield item
            except Unauthenticated as e:
                await abort_with(context, e)

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
    return guard_service(admin_pb2.DESCRIPTOR.services_by_name["Admin"])(cls)


def guard_service(service: ServiceDescriptor) -> Callable[[type[S]], type[S]]:
    """The same for another operator-facing service (`Tunnels`): one table, `ROLE_NEEDED`, for all of them."""

    def wrap(cls: type[S]) -> type[S]:
        for method in service.methods:
            setattr(cls, method.name, _guard(method.name, getattr(cls, method.name), method.server_streaming))
        return cls

    return wrap
