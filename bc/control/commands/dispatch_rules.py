"""Which pending commands a session sends now: pure rules over rows, tested on their own.

Per lane, in `seq` order, bounded by the lane's gateway credits (control 8,
provision 4, bulk 2) counted over the commands in flight on this session's
epoch. Once a lane is out of credit, later commands of that lane wait, so
order within a lane is kept. Some commands are cancelled here instead of
sent (reference "Dispatch"):

* a pending command whose cancel was requested (`cancelled`);
* a body that does not decode, lacks `not_after`, or names another command
  or node (`invalid-body`): the gateway never relays what it cannot vouch for;
* a kind the node's role may not run (`kind-not-allowed`);
* a destructive kind for a tenant-controlled node (`tenant-controlled`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from google.protobuf.message import DecodeError

from bc.protocol import kinds
from bc.protocol.pb.session_pb2 import CommandBody


@dataclass(frozen=True)
class PendingCommand:
    id: str
    node_id: str
    seq: int
    lane: str
    kind: str
    body: bytes
    cancel_requested: bool


@dataclass(frozen=True)
class DispatchPlan:
    send: list[str]
    cancel: list[tuple[str, str]]  # (command id, reason)
    blocked: frozenset[str] = frozenset()  # lanes out of credit: their later commands wait


def guard(cmd: PendingCommand, role: str, tenant_controlled: bool) -> str | None:
    """The reason to cancel instead of send, or None to send."""
    if cmd.cancel_requested:
        return "cancelled"
    body = CommandBody()
    try:
        body.ParseFromString(cmd.body)
    except DecodeError:
        return "invalid-body"
    if body.id != cmd.id or body.node_id != cmd.node_id or body.not_after_ms <= 0 or body.kind != cmd.kind:
        return "invalid-body"
    kind = kinds.get(cmd.kind)
    if kind is None or role not in kind.roles:
        return "kind-not-allowed"
    if kind.destructive and tenant_controlled:
        return "tenant-controlled"
    return None


def plan_dispatch(
    pending: Iterable[PendingCommand],
    in_flight: Mapping[str, int],
    role: str,
    tenant_controlled: bool = False,
    credits: Mapping[str, int] = kinds.GATEWAY_CREDITS,
    blocked_before: Iterable[str] = (),
) -> DispatchPlan:
    """`blocked_before`: lanes an earlier part of the same pass found out of credit (a node's backlog read in
    pages): they stay blocked, so a credit that comes free between pages never lets a later command overtake
    a waiting one."""
    used = dict(in_flight)
    blocked: set[str] = set(blocked_before)
    send: list[str] = []
    cancel: list[tuple[str, str]] = []
    for cmd in sorted(pending, key=lambda c: c.seq):
        reason = guard(cmd, role, tenant_controlled)
        if reason is not None:
            cancel.append((cmd.id, reason))
            continue
        if cmd.lane in blocked:
            continue
        if used.get(cmd.lane, 0) >= credits.get(cmd.lane, 0):
            blocked.add(cmd.lane)
            continue
        used[cmd.lane] = used.get(cmd.lane, 0) + 1
        send.append(cmd.id)
    return DispatchPlan(send, cancel, frozenset(blocked))
