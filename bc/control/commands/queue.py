"""The command queue: enqueue, apply a node's updates, cancel, and the reads the views need.

Enqueue is one transaction: the checks (kind, role, `not_after`), the
idempotency lookup, the node's next `seq`, the `CommandBody` encoded once and
stored as bytes with the signature the `Signer` makes over them (the gateway
resends exactly those bytes, signed or not; with `NullSigner` the row is
unsigned), the `command.enqueued` event, and after commit a poke to the node's
gateway. The command id is a ULID from the injected Random. A
command is never enqueued without a `not_after`: the daemon treats a command
without one as `EXPIRED`, and a command that could run arbitrarily late is
the thing the reference's rule ("if running it late could do harm, it is a
command with `not_after`") exists to prevent. A payload over `max_payload_bytes`
(`bc.protocol.limits`), as JSON text or encoded, is refused before the
transaction, so nothing is stored and no node is ever sent it.

RunCommand and EnqueueCommands are one path (`bc.control.commands.runs`): each
member is parsed and checked as RunCommand always checked its one command,
then all are enqueued in one transaction (`enqueue_all`), so many commands are
all stored or none is. The first member refused refuses the call; with more than one
member its sentence starts by naming it ("command 7 of 100 (inventory.refresh
on n7): no node named 'n7'"), and a call whose reply could not fit a frame is
refused too (`check_reply_size`). The jobs, the batches and the simulator
enqueue through `enqueue`/`enqueue_in`, the same code with one member.

Updates from a node go through the pure state table (`command_states`) and
are scoped to the reporting node in SQL: an unknown id or another node's
command changes nothing, and a stale or repeated report changes nothing.
Results are stored exactly as received, never re-encoded, so the node's
signature over them stays checkable; with signing on (`Signer.attested`) a
terminal result of an attested kind moves nothing unless it carries it.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

from google.protobuf import any_pb2

from bc.control.base.bus import Bus
from bc.control.base.events import publish
from bc.control.commands import states as cs
from bc.control.signing import attestation
from bc.control.signing.signer import Signer
from bc.errors import Conflict, NotFound, UsageError
from bc.protocol import kinds, limits
from bc.protocol.payloads import payload_for as payload_for  # re-exported: the control plane parses from here
from bc.protocol.payloads import payload_from_json as payload_from_json
from bc.protocol.pb import session_pb2
from bc.seams.ids import ulid
from bc.store import Row, Store, Tx
from bc.store import commands as cmd_sql
from bc.store import dispatch as dispatch_sql
from bc.store import nodes as nodes_sql

DEFAULT_NOT_AFTER_S = 600.0
MIN_NOT_AFTER_S = 1.0
MAX_NOT_AFTER_S = 7 * 86400.0
DEFAULT_LIST_LIMIT = 100
MAX_LIST_LIMIT = 1000


@dataclass(frozen=True)
class EnqueueRequest:
    node_id: str
    kind: str
    payload: any_pb2.Any
    not_after_s: float = DEFAULT_NOT_AFTER_S
    min_generation: int = 0
    idempotency_key: str = ""
    not_before_s: float = 0
    batch_id: str = ""
    requested_by: str = ""  # the operator who asked ("" for the control plane's own)
    preapproval: int = 0  # the health policy version whose signed pre-approval the gateway sends with it


@dataclass(frozen=True)
class UpdateOutcome:
    """What a node's `CommandUpdate` did.

    `known` is False for an unknown id or another node's command (nothing changed);
    `changed` is False for a stale or repeated report; `terminal` says whether the
    command is settled now (so the gateway acknowledges it); `state` is its state;
    `rejected` is set when an attested result lacked the node's valid signature.
    """

    known: bool
    changed: bool
    terminal: bool
    state: str
    rejected: str = ""  # why the node's signature did not hold: the update was refused and must not be acked


# -- kinds and payloads ------------------------------------------------------------


def kind_of(name: str) -> kinds.Kind:
    """The registered kind, or a UsageError that lists the known ones."""
    k = kinds.get(name)
    if k is None:
        raise UsageError(f"unknown command kind {name!r}; known kinds: {', '.join(sorted(kinds.KINDS))}")
    return k


def check_batch_size(kind: str, node_ids: Sequence[str], payload_json: str) -> None:
    """A batch's sizes before anything else about it: at most `max_batch_nodes` nodes, a payload within
    `max_payload_bytes`. A batch's reply lists every leaf, so its node count bounds the Admin reply too."""
    limits.check_count("the batch's node list", len(node_ids), "max_batch_nodes")
    limits.check_size(f"the {kind} payload", limits.text_size(payload_json), "max_payload_bytes")


def check_request(req: EnqueueRequest) -> kinds.Kind:
    kind = kind_of(req.kind)
    if not MIN_NOT_AFTER_S <= req.not_after_s <= MAX_NOT_AFTER_S:
        raise UsageError(f"not_after must be between 1 s and 7 days from now, not {req.not_after_s:g} s")
    if not 0 <= req.not_before_s < req.not_after_s:
        raise UsageError(f"not_before ({req.not_before_s:g} s) must be at least 0 and before not_after")
    if req.min_generation < 0:
        raise UsageError(f"min_generation must not be negative, not {req.min_generation}")
    return kind


# -- enqueue -----------------------------------------------------------------------

REPLY_OVERHEAD_BYTES = 160
"""A `CommandInfo`'s bytes besides its strings that vary (tags, the ULID, numbers, lane and state names)."""


@contextmanager
def member(index: int, count: int, node_id: str, kind: str) -> Iterator[None]:
    """A refusal of one of `count` (> 1) members re-raised as the same error, its sentence naming the member.

    Only refusals (bad input, an unknown node, a conflict) are the member's; a store failure is the call's.
    """
    try:
        yield
    except (UsageError, NotFound, Conflict) as e:
        if count <= 1:
            raise
        raise type(e)(f"command {index + 1} of {count} ({kind} on {node_id!r}): {e.message}") from None


async def enqueue(
    store: Store,
    bus: Bus | None,
    signer: Signer,
    req: EnqueueRequest,
    rng: random.Random,
) -> Row:
    """Queue a command `pending` for its node; a repeated idempotency key returns the first command unchanged."""
    [row] = await enqueue_all(store, bus, signer, [req], rng)
    return row


async def enqueue_all(
    store: Store,
    bus: Bus | None,
    signer: Signer,
    reqs: Sequence[EnqueueRequest],
    rng: random.Random,
) -> list[Row]:
    """`enqueue` for each of `reqs` in one transaction: every check first, then every insert; the first
    refusal (named by `member`) rolls all of them back. The rows in order (a repeated key: the first)."""
    checked = []
    for i, req in enumerate(reqs):
        with member(i, len(reqs), req.node_id, req.kind):
            checked.append((req, check_request(req), payload_for(req.kind, req.payload)))
    now_ms = await store.now_ms()
    async with store.transaction() as tx:
        rows = []
        taken = NodesTaken()
        for i, (req, kind, payload) in enumerate(checked):
            with member(i, len(reqs), req.node_id, req.kind):
                rows.append(await enqueue_in(tx, bus, signer, req, kind, payload, now_ms, rng, taken=taken))
        await taken.write_back(tx)
        check_reply_size(rows)
        return rows


@dataclass
class NodesTaken:
    """What one enqueue transaction has read and taken of each node: its row, and the seqs handed out.

    A call of many commands for one node (a scheduler's or a script's batch) reads the node once and
    raises its `next_cmd_seq` once: the first command's `next_seq` UPDATE holds the node's row to the
    commit, the others take the seqs after it in memory, and `write_back` stores where they ended. A
    fan-out of one command a node reads and takes as a single enqueue does.
    """

    rows: dict[str, Row] = field(default_factory=dict)
    next_seq: dict[str, int] = field(default_factory=dict)
    """The seq the node's next command in this transaction takes."""
    moved: set[str] = field(default_factory=set)
    """Nodes that handed out seqs past their `next_seq` UPDATE: `write_back` stores their next one."""

    async def node(self, tx: Tx, node_id: str) -> Row | None:
        row = self.rows.get(node_id)
        if row is None:
            row = await nodes_sql.get(tx, node_id)
            if row is not None:
                self.rows[node_id] = row
        return row

    async def take_seq(self, tx: Tx, node_id: str) -> int | None:
        seq = self.next_seq.get(node_id)
        if seq is None:
            seq = await cmd_sql.next_seq(tx, node_id)
            if seq is None:
                return None
        else:
            self.moved.add(node_id)
        self.next_seq[node_id] = seq + 1
        return seq

    async def write_back(self, tx: Tx) -> None:
        for node_id in sorted(self.moved):
            await cmd_sql.set_next_seq(tx, node_id, self.next_seq[node_id])


def reply_size(rows: Sequence[Row]) -> int:
    """About what the reply listing `rows` takes, results left out (they are dropped to fit: `fit_command_results`)."""
    texts = ("id", "node_id", "kind", "reason", "message", "idempotency_key", "boot_id", "batch_id")
    more = ("requested_by", "signer_key_id")
    return sum(
        REPLY_OVERHEAD_BYTES
        + sum(len(str(r[k] or "").encode()) for k in texts)
        + sum(len(str(r.get(k) or "").encode()) for k in more)
        for r in rows
    )


def check_reply_size(rows: Sequence[Row]) -> None:
    """A UsageError (so the transaction rolls back) when the reply listing `rows` could not fit a frame."""
    size = reply_size(rows)
    if size > limits.LIMITS.max_frame_bytes:
        raise UsageError(
            f"the reply to these {len(rows):,} commands would be about {size:,} bytes; the limit is"
            f" {limits.LIMITS.max_frame_bytes:,} bytes (max_frame_bytes): send fewer commands per call"
        )


async def enqueue_in(
    tx: Tx,
    bus: Bus | None,
    signer: Signer,
    req: EnqueueRequest,
    kind: kinds.Kind,
    payload: any_pb2.Any,
    now_ms: int,
    rng: random.Random,
    *,
    held: bool = False,
    taken: NodesTaken | None = None,
) -> Row:
    """`enqueue` inside the caller's transaction (a batch enqueues all its commands in one, `held`).

    `taken`: what this transaction already read and took of the nodes (`enqueue_all`), whose
    `write_back` the caller runs before the commit; None reads and takes for this command alone."""
    node = await taken.node(tx, req.node_id) if taken is not None else await nodes_sql.get(tx, req.node_id)
    if node is None:
        raise NotFound(f"no node named {req.node_id!r}")
    role = str(node["role"])
    if role not in kind.roles:
        runs_on = ", ".join(sorted(kind.roles))
        raise UsageError(f"kind {req.kind} does not run on node {req.node_id} (role {role}); it runs on {runs_on}")
    if req.idempotency_key:
        first = await cmd_sql.by_idempotency_key(tx, req.node_id, req.idempotency_key)
        if first is not None:
            return first
    command_id = ulid(now_ms / 1000, rng)
    key = req.idempotency_key or f"cmd:{command_id}"
    seq = await taken.take_seq(tx, req.node_id) if taken is not None else await cmd_sql.next_seq(tx, req.node_id)
    if seq is None:  # the node row went away between the reads; treat it as never there
        raise NotFound(f"no node named {req.node_id!r}")
    not_after_ms = now_ms + round(req.not_after_s * 1000)
    not_before_ms = now_ms + round(req.not_before_s * 1000) if req.not_before_s else 0
    body = session_pb2.CommandBody(
        id=command_id,
        node_id=req.node_id,
        seq=seq,
        kind=req.kind,
        payload=payload,
        lane=session_pb2.Lane.Name(kinds.LANES[kind.lane]),
        not_after_ms=not_after_ms,
        min_generation=req.min_generation,
        retry_safe=kind.retry_safe,
        idempotency_key=key,
        self_terminating=kind.self_terminating,
        attested=kind.attested,
        batch_id=req.batch_id,
    )
    body_bytes = body.SerializeToString(deterministic=True)
    signed = signer.sign_command(body_bytes)
    row = await cmd_sql.insert(
        tx,
        id_=command_id,
        node_id=req.node_id,
        seq=seq,
        kind=req.kind,
        lane=kind.lane,
        body=body_bytes,
        signature=signed.stored,
        signer_key_id=signed.key_id,
        not_before_ms=not_before_ms,
        not_after_ms=not_after_ms,
        min_generation=req.min_generation,
        idempotency_key=key,
        retry_safe=kind.retry_safe,
        self_terminating=kind.self_terminating,
        attested=kind.attested,
        batch_id=req.batch_id,
        now_ms=now_ms,
        held=held,
        requested_by=req.requested_by,
        preapproval=req.preapproval,
    )
    if row is None:
        # A concurrent enqueue with the same key committed first (PostgreSQL); it wins.
        first = await cmd_sql.by_idempotency_key(tx, req.node_id, key)
        assert first is not None
        return first
    await publish(
        tx,
        bus,
        "command.enqueued",
        command_id,
        {"node_id": req.node_id, "kind": req.kind, "seq": seq, "idempotency_key": key},
        now_ms,
    )
    if bus is not None:
        node_id = req.node_id
        tx.on_commit(lambda: bus.node_changed(node_id))
    return row


SECURITY_REJECTIONS = {
    "BAD_SIGNATURE": "security.bad-signature",
    "BATCH_UNAPPROVED": "security.batch-unapproved",
    "UNBATCHED_LIMIT": "security.unbatched-limit",
}


# -- updates from the node -----------------------------------------------------------


async def apply_update(
    tx: Tx,
    bus: Bus | None,
    signer: Signer,
    node_id: str,
    update: session_pb2.CommandUpdate,
    now_ms: int,
    *,
    lock: str = "",
) -> UpdateOutcome:
    """Apply one `CommandUpdate` from `node_id`'s session, in the caller's transaction.

    The common report (the next step of the node's own command, a result that needs no signature checked)
    is one UPDATE that returns the command's kind (`_report_at_once`); anything else is read first.
    """
    if not lock:
        done = await _report_at_once(tx, bus, node_id, update, now_ms)
        if done is not None:
            return done
    row = await cmd_sql.get_for_node(tx, update.command_id, node_id, lock)
    if row is None:
        other = await cmd_sql.get(tx, update.command_id)
        if other is not None:
            await publish(
                tx,
                bus,
                "security.node-mismatch",
                node_id,
                {"command_id": update.command_id, "owner": str(other["node_id"]), "kind": "command-update"},
                now_ms,
            )
        return UpdateOutcome(known=False, changed=False, terminal=False, state="")
    current = str(row["state"])
    target = cs.next_state(current, update.state)
    if target is None:
        return UpdateOutcome(known=True, changed=False, terminal=cs.is_terminal(current), state=current)
    terminal = cs.is_terminal(target)
    kind = str(row["kind"])
    if terminal and kinds.is_attested(kind):
        why = await attestation.check_result(tx, signer, node_id, update)
        if why is not None:
            data = {"command_id": update.command_id, "kind": kind, "state": target, "reason": why}
            await publish(tx, bus, "security.result-rejected", node_id, data, now_ms)
            return UpdateOutcome(known=True, changed=False, terminal=False, state=current, rejected=why)
    if terminal:
        moved = await cmd_sql.settle(
            tx,
            update.command_id,
            expected=current,
            state=target,
            reason=update.reason,
            message=update.message,
            now_ms=now_ms,
            node_id=node_id,
            result=bytes(update.result),
            node_sig=bytes(update.node_sig),
            boot_id=update.boot_id,
        )
    else:
        moved = await cmd_sql.advance(
            tx, update.command_id, node_id, expected=current, state=target, boot_id=update.boot_id, now_ms=now_ms
        )
    if not moved:
        # Another writer moved it first (only possible without a row lock); report what stands.
        again = await cmd_sql.get_for_node(tx, update.command_id, node_id)
        state = str(again["state"]) if again else current
        return UpdateOutcome(known=True, changed=False, terminal=cs.is_terminal(state), state=state)
    return await _moved(tx, bus, node_id, update, kind, target, now_ms)


async def _report_at_once(
    tx: Tx, bus: Bus | None, node_id: str, update: session_pb2.CommandUpdate, now_ms: int
) -> UpdateOutcome | None:
    """The report applied by one UPDATE from the state a node in order reports it from (the latest on the line
    that the state table lets it move: `accepted` after dispatch, `running` after `accepted`, a result after
    `running`) and, for a result, of a kind that needs no attestation. None when it matched nothing: the
    caller reads the row and decides by the table as it always did (unknown, another node's, a report that
    skipped a step, stale, repeated, attested)."""
    target = cs.state_name(update.state)
    if target is None:
        return None
    from_states = [s for s in cs.STATES if cs.next_state(s, update.state) == target]
    if not from_states:
        return None
    terminal = cs.is_terminal(target)
    settled = (update.reason, update.message, bytes(update.result), bytes(update.node_sig)) if terminal else None
    kind = await cmd_sql.report(
        tx,
        update.command_id,
        node_id,
        expected=max(from_states, key=cs.rank),
        state=target,
        boot_id=update.boot_id,
        now_ms=now_ms,
        settled=settled,
        not_kinds=sorted(kinds.ATTESTED) if terminal else (),
    )
    if kind is None:
        return None
    return await _moved(tx, bus, node_id, update, kind, target, now_ms)


async def _moved(
    tx: Tx, bus: Bus | None, node_id: str, update: session_pb2.CommandUpdate, kind: str, target: str, now_ms: int
) -> UpdateOutcome:
    """The events of a report that moved its command to `target`."""
    terminal = cs.is_terminal(target)
    if terminal:
        data = {"node_id": node_id, "kind": kind, "state": target, "reason": update.reason}
        await publish(tx, bus, "command.settled", update.command_id, data, now_ms)
        if target == "rejected" and update.reason in SECURITY_REJECTIONS:
            # The node refused what reached it as ours: intent altered on the way, or a destructive command
            # without the quorum behind it.
            sec = {"command_id": update.command_id, "kind": kind, "why": update.message}
            await publish(tx, bus, SECURITY_REJECTIONS[update.reason], node_id, sec, now_ms)
    else:
        await publish(
            tx, bus, "command.updated", update.command_id, {"node_id": node_id, "kind": kind, "state": target}, now_ms
        )
    return UpdateOutcome(known=True, changed=True, terminal=terminal, state=target)


# -- cancel --------------------------------------------------------------------------


async def request_cancel(store: Store, bus: Bus | None, command_id: str, reason: str = "") -> Row:
    """Cancel a command: at once if it was never sent, by a `Cancel` to the node if it is in flight.

    A settled command is returned unchanged: cancelling twice, or after the
    outcome, is not an error (a real outcome always wins over a late cancel).
    """
    now_ms = await store.now_ms()
    async with store.transaction() as tx:
        return await request_cancel_in(tx, bus, command_id, reason, now_ms)


async def request_cancel_in(tx: Tx, bus: Bus | None, command_id: str, reason: str, now_ms: int) -> Row:
    """`request_cancel` in the caller's transaction (a job cancelling the command its node sent)."""
    reason = reason.strip() or "cancelled by the operator"
    row = await cmd_sql.get(tx, command_id)
    if row is None:
        raise NotFound(f"no command {command_id!r}")
    node_id, kind, state = str(row["node_id"]), str(row["kind"]), str(row["state"])
    if state == cs.PENDING and await cmd_sql.cancel_pending(tx, command_id, reason, now_ms):
        data = {"node_id": node_id, "kind": kind, "state": cs.CANCELLED, "reason": "cancelled"}
        await publish(tx, bus, "command.settled", command_id, data, now_ms)
    elif state in cs.IN_FLIGHT and await cmd_sql.request_cancel(tx, command_id, reason, now_ms):
        data = {"node_id": node_id, "kind": kind, "state": state, "reason": reason}
        await publish(tx, bus, "command.cancel-requested", command_id, data, now_ms)
        if bus is not None:
            tx.on_commit(lambda: bus.node_changed(node_id))
    out = await cmd_sql.get(tx, command_id)
    assert out is not None
    return out


# -- the server settles (the reads of commands live in bc.control.reads.queries) -----------


async def settle_by_server(
    tx: Tx,
    bus: Bus | None,
    command_id: str,
    node_id: str,
    state: str,
    reason: str,
    now_ms: int,
    from_states: tuple[str, ...],
    *,
    kind: str = "",
) -> bool:
    """Settle a command the control plane decided (a guard, a resume rule, a refusal) and publish
    `command.settled`; only from `from_states`. False when it was in none of them (nothing published)."""
    if not await dispatch_sql.settle(tx, command_id, node_id, state, reason, now_ms, from_states):
        return False
    data = {"node_id": node_id, "state": state, "reason": reason}
    if kind:
        data["kind"] = kind
    await publish(tx, bus, "command.settled", command_id, data, now_ms)
    return True


__all__ = [
    "EnqueueRequest",
    "UpdateOutcome",
    "apply_update",
    "enqueue",
    "enqueue_all",
    "kind_of",
    "payload_from_json",
    "request_cancel",
]
