"""The Hello transaction: check the certificate, bump the epoch, route the node here, and resume its commands.

Resume rules (reference "Gateway crash", "Journal loss", "Node reboot"), all
in the one transaction that bumps the epoch:

1. the node's unacked results are applied first (they are facts);
2. a new `journal_id` fails every in-flight command that is not retry-safe with
   `journal-lost`: replaying it into a journal that cannot deduplicate could run
   it twice;
3. a new `boot_id` completes every in-flight self-terminating command as
   `succeeded` with `rebooted`: the reboot it caused is its outcome;
4. what is still in flight moves to the new epoch and is replayed in `seq`
   order, except what the node reports as running (it re-attaches).

A Hello carries only the unacked results that fit one frame
(`max_frame_bytes`); the node sends the rest as CommandUpdates once welcomed,
so a command whose result is not in the Hello may be replayed and answered
from the node's journal. A result over `max_result_bytes` (an older agent's)
is acked as refused and settles its command `result-too-large`
(`bc.gateway.oversize`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from google.protobuf import json_format

from bc.control.base.bus import Bus
from bc.control.base.events import publish
from bc.control.commands.queue import apply_update, settle_by_server
from bc.control.signing.signer import Signer
from bc.errors import Unauthenticated, Unavailable, UsageError
from bc.gateway.oversize import fit_texts, refuse_oversized_update
from bc.pki.identity import PeerIdentity
from bc.protocol import closing
from bc.protocol import connectivity as cx
from bc.protocol import labels as node_labels
from bc.protocol.closing import SessionRefused
from bc.protocol.pb import session_pb2
from bc.store import Store, Tx
from bc.store import commands as commands_sql
from bc.store import dispatch as dispatch_sql
from bc.store import events as events_sql
from bc.store import identity as id_sql
from bc.store import leases as leases_sql
from bc.store import nodes as nodes_sql
from bc.store import revocation as rev_sql
from bc.store.leases import Claim


@dataclass(frozen=True)
class HelloResult:
    epoch: int
    generation: int
    inventory_hash: str
    replay: list[str] = field(default_factory=list)  # command ids to resend, in seq order
    ack: list[str] = field(default_factory=list)  # terminal results from Hello to acknowledge
    quarantined: bool = False  # this Hello tipped a cloned identity over the limit: its certificate is revoked


async def hello_transaction(
    store: Store, bus: Bus, signer: Signer, gateway_id: str, peer: PeerIdentity, hello: session_pb2.Hello
) -> HelloResult:
    """The Hello in a transaction of its own (the gateway runs `hello_in` in its group commit instead)."""
    now_ms = await store.now_ms()
    async with store.transaction() as tx:
        return await hello_in(tx, store.dialect, bus, signer, gateway_id, peer, hello, now_ms)


async def hello_in(
    tx: Tx,
    dialect: str,
    bus: Bus,
    signer: Signer,
    gateway_id: str,
    peer: PeerIdentity,
    hello: session_pb2.Hello,
    now_ms: int,
    claim: Claim | None = None,
) -> HelloResult:
    """The Hello's writes in `tx`. Safe to run again on a rolled-back transaction (a group commit's split):
    everything it changes is in `tx`, and its wake-ups are registered with `tx.on_commit`."""
    # A routing write: only while this gateway holds its lease (a fenced or zombie gateway routes nothing).
    # `claim`: this process's own holder and epoch (bc.gateway.lease); without one, the lease's holder is the id.
    claim = claim or Claim(f"gateway:{gateway_id}", gateway_id)
    if not await leases_sql.held(tx, claim.name, claim.holder, now_ms, dialect, claim.epoch):
        raise Unavailable(f"gateway {gateway_id} does not hold its lease; try another")
    cert = await id_sql.get_cert(tx, peer.serial)
    node = await nodes_sql.get(tx, peer.name)
    if cert is None or node is None or str(cert["node_id"]) != peer.name:
        raise Unauthenticated(f"certificate {peer.serial} is not a certificate of node {peer.name}")
    if cert["revoked_at_ms"] is not None:
        raise SessionRefused(closing.REVOKED, f"certificate {peer.serial} of node {peer.name} has been revoked")
    if cert["session_of"] is not None:
        # A session certificate (bc.pki.session_cert) lives only as long as the node certificate it was issued
        # against: revoking the node revokes both, and this holds even for a row revoked alone.
        parent = await id_sql.get_cert(tx, str(cert["session_of"]))
        if parent is None or parent["revoked_at_ms"] is not None:
            raise SessionRefused(
                closing.REVOKED,
                f"certificate {cert['session_of']} of node {peer.name}, whose session certificate {peer.serial}"
                " this is, has been revoked",
            )
    if int(cert["identity_generation"]) != int(node["identity_generation"]):
        raise SessionRefused(
            closing.IDENTITY_REPLACED,
            f"certificate {peer.serial} belongs to an older identity of node {peer.name}; join again",
        )
    labels = json.loads(str(node["labels"] or "{}"))
    with_caps = capability_labels(labels, hello.capabilities)
    inventory_hash = str(node["inventory_hash"])
    inventory_json: str | None = None
    if hello.HasField("inventory"):
        inventory_hash = hello.inventory_hash
        inventory_json = json_format.MessageToJson(hello.inventory, preserving_proto_field_name=True)
    # The epoch bump, then one write of the node's row: connected and seen, what the node applied, its
    # capabilities (and their labels, when they changed) and its inventory (when the Hello carries one).
    opened = await nodes_sql.open_session(
        tx,
        node_id=peer.name,
        gateway_id=gateway_id,
        journal_id=hello.journal_id,
        boot_id=hello.boot_id,
        incarnation_id=hello.incarnation_id,
        cert_serial=peer.serial,
        now_ms=now_ms,
        node=node,
        hello=nodes_sql.HelloColumns(
            applied_generation=hello.applied_generation,
            applied_spec_hash=hello.applied_spec_hash,
            capabilities_json=json.dumps(sorted(hello.capabilities)),
            labels_json=json.dumps(with_caps, sort_keys=True) if with_caps != labels else None,
            inventory_json=inventory_json,
            inventory_hash=inventory_hash,
        ),
    )
    await publish(
        tx,
        bus,
        "node.connectivity",
        peer.name,
        {
            "state": cx.CONNECTED,
            "epoch": opened.epoch,
            "gateway_id": gateway_id,
            "boot_id": hello.boot_id,
            "journal_id": hello.journal_id,
            "applied_generation": hello.applied_generation,
            "new_journal": bool(opened.previous_journal_id) and opened.previous_journal_id != hello.journal_id,
            "new_boot": bool(opened.previous_boot_id) and opened.previous_boot_id != hello.boot_id,
        },
        now_ms,
    )
    generation = int(node["generation"])
    if await _duplicate_session(tx, bus, peer, hello, opened, now_ms):
        return HelloResult(opened.epoch, generation, inventory_hash, quarantined=True)
    replay, ack = await _resume_commands(tx, bus, signer, peer.name, hello, opened, now_ms)
    return HelloResult(opened.epoch, generation, inventory_hash, replay, ack)


CAPABILITY_PREFIX = "bc.dev/cap."
MAX_CAPABILITY_LABELS = 32


def capability_labels(labels: Mapping[str, str], capabilities: Iterable[str]) -> dict[str, str]:
    """The node's labels with its `bc.dev/cap.<name>=1` system labels replaced by what this Hello advertises.

    Operator labels stay as they are; a capability that would not make a valid label key is skipped (a node
    cannot write itself arbitrary labels), and at most MAX_CAPABILITY_LABELS are written.
    """
    out = {k: v for k, v in labels.items() if not k.startswith(CAPABILITY_PREFIX)}
    written = 0
    for cap in sorted(set(capabilities)):
        key = CAPABILITY_PREFIX + cap
        try:
            node_labels.check_key(key)
        except UsageError:
            continue
        if written == MAX_CAPABILITY_LABELS:
            break
        out[key] = "1"
        written += 1
    return dict(sorted(out.items()))


DUPLICATE_WINDOW_MS = 10 * 60 * 1000
DUPLICATE_LIMIT = 3


async def _duplicate_session(
    tx: Tx, bus: Bus, peer: PeerIdentity, hello: session_pb2.Hello, opened: nodes_sql.SessionOpened, now_ms: int
) -> bool:
    """A Hello from another boot while the node's session is still open: two machines share one identity.

    Each takeover is `security.node.duplicate-session`; more than 3 within 10
    minutes revokes the node's certificates (`duplicate-identity`), which ends
    both clones' sessions through the revocation feed, and publishes
    `security.node.quarantined`. Nothing is released: the real machine's
    workloads keep running until an operator re-joins it. Returns True when
    this Hello quarantined the node.
    """
    if not (opened.previous_open and opened.previous_boot_id and opened.previous_boot_id != hello.boot_id):
        return False
    data = {
        "serial": peer.serial,
        "previous_boot_id": opened.previous_boot_id,
        "boot_id": hello.boot_id,
        "previous_incarnation_id": opened.previous_incarnation_id,
        "incarnation_id": hello.incarnation_id,
        "epoch": opened.epoch,
    }
    await publish(tx, bus, "security.node.duplicate-session", peer.name, data, now_ms)
    # Only takeovers of this identity count: a re-joined node starts with a clean slate.
    since = max(now_ms - DUPLICATE_WINDOW_MS, await rev_sql.identity_started_ms(tx, peer.name))
    # The earlier takeovers, and this one: its event is appended when this transaction commits.
    seen = await events_sql.count(tx, "security.node.duplicate-session", peer.name, since) + 1
    if seen <= DUPLICATE_LIMIT:
        return False
    serials = await rev_sql.revoke_node(tx, peer.name, "duplicate-identity", now_ms)
    await publish(
        tx,
        bus,
        "security.node.quarantined",
        peer.name,
        {"reason": "duplicate-identity", "serials": serials, "takeovers": seen},
        now_ms,
    )
    return True


TERMINAL_UPDATES = (
    session_pb2.COMMAND_SUCCEEDED,
    session_pb2.COMMAND_FAILED,
    session_pb2.COMMAND_REJECTED,
    session_pb2.COMMAND_CANCELLED,
)


async def _resume_commands(
    tx: Tx,
    bus: Bus,
    signer: Signer,
    node_id: str,
    hello: session_pb2.Hello,
    opened: nodes_sql.SessionOpened,
    now_ms: int,
) -> tuple[list[str], list[str]]:
    ack: list[str] = []
    for update in hello.unacked_results:
        if await refuse_oversized_update(tx, bus, node_id, update, now_ms):
            ack.append(update.command_id)  # refused, and said so: the node must stop resending it
            continue
        applied = await apply_update(tx, bus, signer, node_id, fit_texts(update), now_ms)
        if update.state in TERMINAL_UPDATES and not applied.rejected:
            ack.append(update.command_id)
    new_journal = bool(opened.previous_journal_id) and opened.previous_journal_id != hello.journal_id
    new_boot = bool(opened.previous_boot_id) and opened.previous_boot_id != hello.boot_id
    in_flight = await commands_sql.in_flight_for_node(tx, node_id)
    settled = False
    for c in in_flight:
        outcome: tuple[str, str] | None = None
        if new_journal and not c["retry_safe"]:
            outcome = ("failed", "journal-lost")
        elif new_boot and c["self_terminating"]:
            outcome = ("succeeded", "rebooted")
        cid = str(c["id"])
        if outcome:
            state, reason = outcome
            await settle_by_server(
                tx, bus, cid, node_id, state, reason, now_ms, dispatch_sql.IN_FLIGHT, kind=str(c["kind"])
            )
            settled = True
    if not in_flight:
        # Nothing to move or replay (the common Hello): no other writer can put one of the node's commands in
        # flight before this transaction commits, since a dispatch pass share-locks the session row this
        # transaction has just written.
        return [], ack
    await dispatch_sql.move_to_epoch(tx, node_id, opened.epoch)
    if settled:  # read again: what settling changed
        in_flight = await commands_sql.in_flight_for_node(tx, node_id)
    running = set(hello.running_command_ids)
    replay = [str(c["id"]) for c in in_flight if str(c["id"]) not in running]
    return replay, ack
