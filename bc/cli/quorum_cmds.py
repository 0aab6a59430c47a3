"""The destructive-batch quorum: `bc approve`, `bc approvers`, `bc batch`.

An approver's private key lives in one file on the approver's own machine
(`bc approve keygen`, 0600) and never leaves it: `bc approve sign` reads the
batch from the server, recomputes its Merkle root from the leaves itself (a
server that lies about the scope gets a signature over a root it did not
claim, which counts for nothing), shows what the root covers, and sends only
the signature — under the approver's own operator certificate, since a key
counts only for the operator it is registered to.

A change of the approver set, k or the allowance is itself approved the same
way once approvers exist: `bc approvers add|remove|threshold|allowance` then
makes a pending quorum change (`q-…`) that `bc approve show|sign|reject`
handle like a batch; the signer's `bc` recomputes what the change does and
both settings' digests from the settings themselves.
"""

from __future__ import annotations

import base64
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

import click
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from bc.cli.admin_cmds import ROOT_KEY_OPTION, call_admin, json_option, read_json_object
from bc.cli.emit import emit
from bc.cli.output import Lines, confirm, echo, lines, paragraphs
from bc.cli.render import cell, format_age, format_time_ms, parse_duration, render_fields, render_table
from bc.client.admin import AdminClient
from bc.client.approver_key import load_approver_key, public_raw
from bc.control.quorum.approvers import MAX_ALLOWANCE, MAX_THRESHOLD
from bc.errors import UsageError
from bc.pki import batch_scope, preapproval
from bc.pki import quorum as q
from bc.pki.batch_scope import recompute_root
from bc.protocol.pb import admin_pb2
from bc.runtime.files import atomic_write

DEFAULT_APPROVAL_TTL_S = 3600


# -- what a batch covers ---------------------------------------------------------------


def scope_summary(b: admin_pb2.BatchInfo, limit: int = 6) -> str:
    if b.kind == preapproval.BATCH_KIND:  # read from the payload the signature covers
        try:
            return preapproval.summary(b.payload_json)
        except UsageError as e:
            return f"{b.kind}: {e.message}"
    if b.kind == batch_scope.BULK_BATCH_KIND:  # several kinds: each leaf is its kind on its node
        steps = [f"{leaf.kind} on {leaf.node_id}" for leaf in b.leaves]
        more = f" and {len(steps) - limit} more" if len(steps) > limit else ""
        return f"{b.kind}: {len(steps)} leaves ({', '.join(steps[:limit])}{more})"
    nodes = [leaf.node_id for leaf in b.leaves]
    shown = ", ".join(nodes[:limit]) + (f" and {len(nodes) - limit} more" if len(nodes) > limit else "")
    return f"{b.kind} on {len(nodes)} node(s) ({shown})"


def render_batch(b: admin_pb2.BatchInfo) -> Lines:
    fields: list[tuple[str, object]] = [
        ("batch", b.id),
        ("state", b.state),
        *([("job", f"{b.dag_id} (resolved {b.resolution or 'not yet'})")] if b.dag_id else []),
        ("scope", scope_summary(b)),
        ("payload", b.payload_json),
        ("requested by", b.requested_by),
        ("reason", b.reason or "-"),
        ("scope root", b.scope_root),
        ("approvals", f"{b.approvals} of {b.threshold}"),
        ("expires", format_time_ms(b.not_after_ms)),
    ]
    parts: list[Lines] = [render_fields(fields)]
    rows = [
        (leaf.index, leaf.node_id, leaf.kind, leaf.payload_digest[:16] + "…", leaf.command_id, leaf.command_state)
        for leaf in b.leaves
    ]
    parts.append(lines("LEAVES", render_table(("#", "NODE", "KIND", "PAYLOAD DIGEST", "COMMAND", "STATE"), rows)))
    if b.decisions:
        drows = [
            (d.name, d.decision, d.key_id[:23] + "…", format_age(d.at_age_ms), cell(d.reason)) for d in b.decisions
        ]
        parts.append(lines("DECISIONS", render_table(("APPROVER", "DECISION", "KEY", "WHEN", "REASON"), drows)))
    return paragraphs(*parts)


# -- bc approve ------------------------------------------------------------------------


@click.group("approve")
def approve() -> None:
    """Approver keys, and signing or rejecting destructive batches."""


@approve.command("keygen")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=Path("approver.key"), show_default=True)
@json_option
def approve_keygen(out: Path, as_json: bool) -> None:
    """Make an approver key pair: the private key stays in --out (0600); give the public key to the server."""
    if out.exists():
        raise UsageError(f"{out} already exists; refusing to overwrite a key (choose another --out)")
    key = ed25519.Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    atomic_write(out, pem, mode=0o600)
    raw = public_raw(key)
    doc = {"public_key": base64.b64encode(raw).decode(), "key_id": q.key_id(raw), "path": str(out)}
    text = lines(
        f"approver key written to {out} (keep it to yourself)",
        f"key id:     {doc['key_id']}",
        f"public key: {doc['public_key']}",
        f"on the server: bc approvers add NAME {doc['public_key']}",
    )
    emit(as_json, doc, text)


@approve.command("list")
@json_option
def approve_list(as_json: bool) -> None:
    """Batches and quorum changes waiting for approval, with what each one would do."""
    batches = call_admin(lambda c: c.list_batches(state="pending"))
    changes = call_admin(lambda c: c.list_quorum_changes(state="pending"))
    emit(
        as_json,
        [*batches, *changes],
        lambda: render_waiting(batches, changes),
        empty="nothing is waiting for approval",
    )


def render_waiting(batches: list[admin_pb2.BatchInfo], changes: list[admin_pb2.QuorumChangeInfo]) -> Lines:
    rows = [
        (b.id, cell(scope_summary(b), width=60), f"{b.approvals}/{b.threshold}", b.requested_by, cell(b.reason))
        for b in batches
    ]
    rows += [
        (c.id, cell(change_summary(c), width=60), f"{c.approvals}/{c.threshold}", c.requested_by, "quorum change")
        for c in changes
    ]
    return render_table(("ID", "WHAT", "APPROVALS", "REQUESTED BY", "REASON"), rows)


@approve.command("show")
@click.argument("batch_id", metavar="ID")
@json_option
def approve_show(batch_id: str, as_json: bool) -> None:
    """A batch (every leaf: node, kind, payload digest; the scope root) or a quorum change (q-…)."""
    if is_change(batch_id):
        c = call_admin(lambda cl: cl.get_quorum_change(batch_id))
        emit(as_json, c, lambda: render_change(c))
        return
    _show_batch(batch_id, as_json)


def _show_batch(batch_id: str, as_json: bool) -> None:
    b = call_admin(lambda c: c.get_batch(batch_id))
    emit(as_json, b, lambda: render_batch(b))


def _confirm(b: admin_pb2.BatchInfo, verb: str, yes: bool) -> None:
    echo(render_batch(b), err=True)
    if yes:
        return
    if not sys.stdin.isatty():
        raise UsageError(f"not a terminal: add --yes to {verb} batch {b.id}")
    if not confirm(f"{verb} {scope_summary(b)}?", err=True):
        raise UsageError(f"did not {verb} batch {b.id}")


@approve.command("sign")
@click.argument("batch_id", metavar="ID")
@click.option("--key", "key_file", type=click.Path(dir_okay=False, path_type=Path), required=True)
@click.option(
    "--expires-in",
    default=None,
    help="How long a batch approval counts (default 1h; a health policy's pre-approval: until it expires).",
)
@click.option("--yes", is_flag=True, help="Do not ask (what it covers is still printed on stderr).")
@json_option
def approve_sign(batch_id: str, key_file: Path, expires_in: str | None, yes: bool, as_json: bool) -> None:
    """Sign a batch's scope root, or a quorum change (q-…), with your approver key, after showing what it does."""
    key = load_approver_key(key_file)
    if is_change(batch_id):
        _sign_change(batch_id, key, yes, as_json)
        return
    b = call_admin(lambda c: c.get_batch(batch_id))
    if b.state != "pending":
        raise UsageError(f"batch {batch_id} is {b.state}; there is nothing to sign")
    root = recompute_root(b)
    _confirm(b, "approve", yes)
    now_ms = call_admin(lambda c: c.server_info()).server_time_ms
    if expires_in is None and b.kind == preapproval.BATCH_KIND:
        expires_at_ms = b.not_after_ms  # a standing approval: as long as the pre-approvals it signs
    else:
        ttl_s = parse_duration(expires_in or f"{DEFAULT_APPROVAL_TTL_S}s")
        expires_at_ms = min(now_ms + round(ttl_s * 1000), b.not_after_ms)
    signature = key.sign(q.approval_message(b.id, root, len(b.leaves), b.requested_by, expires_at_ms))
    kid = q.key_id(public_raw(key))
    after = call_admin(lambda c: c.decide_batch(batch_id, kid, signature, approve=True, expires_at_ms=expires_at_ms))
    emit(
        as_json,
        after,
        f"signed batch {batch_id}: {after.approvals} of {after.threshold} approvals; it is {after.state}",
    )


@approve.command("reject")
@click.argument("batch_id", metavar="ID")
@click.option("--key", "key_file", type=click.Path(dir_okay=False, path_type=Path), required=True)
@click.option("--reason", required=True, help="Why: stored, and shown to the requester.")
@json_option
def approve_reject(batch_id: str, key_file: Path, reason: str, as_json: bool) -> None:
    """Reject a batch (its commands never run) or a quorum change (q-…): one approver's signed no fails it."""
    if not reason.strip():
        raise UsageError("a rejection needs a reason")
    key = load_approver_key(key_file)
    if is_change(batch_id):
        c = call_admin(lambda cl: cl.get_quorum_change(batch_id))
        _, to_digest = change_digests(c)
        sig = key.sign(q.change_rejection_message(c.id, to_digest, reason))
        kid = q.key_id(public_raw(key))
        done = call_admin(lambda cl: cl.decide_quorum_change(c.id, kid, sig, approve=False, reason=reason))
        emit(as_json, done, f"rejected quorum change {c.id}; the quorum settings stay as they are")
        return
    b = call_admin(lambda c: c.get_batch(batch_id))
    root = bytes.fromhex(b.scope_root)
    signature = key.sign(q.rejection_message(b.id, root, reason))
    kid = q.key_id(public_raw(key))
    after = call_admin(lambda c: c.decide_batch(batch_id, kid, signature, approve=False, reason=reason))
    emit(as_json, after, f"rejected batch {batch_id}; its commands are cancelled")


# -- bc approvers --------------------------------------------------------------------------


@click.group("approvers", invoke_without_command=True)
@json_option
@click.pass_context
def approvers(ctx: click.Context, as_json: bool) -> None:
    """The server's approver keys and the threshold k (`bc approvers list|add|remove|threshold`)."""
    if ctx.invoked_subcommand is None:
        _show_approvers(call_admin(lambda c: c.list_approvers()), as_json)


def _show_approvers(s: admin_pb2.ApproverSet, as_json: bool) -> None:
    emit(as_json, s, lambda: render_approvers(s))


def render_approvers(s: admin_pb2.ApproverSet) -> Lines:
    rows = [(a.name, a.operator or "(none)", a.key_id, a.public_key, format_age(a.added_age_ms)) for a in s.approvers]
    table = render_table(("NAME", "OPERATOR", "KEY ID", "PUBLIC KEY", "ADDED"), rows)
    note = "" if len(s.approvers) >= s.threshold else f" (only {len(s.approvers)} approver(s): no batch can pass)"
    out: list[Lines | str] = [
        table if rows else "no approvers",
        f"threshold: {s.threshold} distinct approvers{note}",
        f"unbatched destructive commands: {s.unbatched_destructive_per_hour} an hour per node",
        f"quorum settings version: {s.version}",
    ]
    if s.HasField("change"):
        c = s.change
        if c.state == "pending":
            out.append(
                f"quorum change {c.id} is pending: it needs {c.threshold} approval(s) of the current approvers"
                f" (bc approve show {c.id}; bc approve sign {c.id} --key FILE; bc approvers withdraw {c.id})"
            )
        else:
            out.append(f"quorum change {c.id} is {c.state}: {c.summary}")
    return lines(*out)


@approvers.command("list")
@json_option
def approvers_list(as_json: bool) -> None:
    """The approver keys and the threshold."""
    _show_approvers(call_admin(lambda c: c.list_approvers()), as_json)


Propose = Callable[[AdminClient, bytes, bool], Awaitable[admin_pb2.ApproverSet]]


def propose_change(send: Propose, root_key: Path | None) -> admin_pb2.ApproverSet:
    """Ask for a quorum change; with `--root-key`, first preview it, sign its step with the root here, then
    ask with that signature (the root key never leaves this machine; the change still needs its approvals)."""
    if root_key is None:
        return call_admin(lambda c: send(c, b"", False))
    from bc.pki.root_offline import load_root_key, sign_quorum_step

    pki = call_admin(lambda c: c.get_pki())
    key = load_root_key(root_key, pki.roots[0].cert_pem if pki.roots else "")
    preview = call_admin(lambda c: send(c, b"", True))
    if preview.change.state != "preview":  # nothing nodes hold moves: nothing for the root to sign
        return call_admin(lambda c: send(c, b"", False))
    sig = sign_quorum_step(key, preview.change.from_settings, preview.change.to_settings)
    return call_admin(lambda c: send(c, sig, False))


@approvers.command("add")
@click.argument("name")
@click.argument("public_key", metavar="PUBKEY")
@click.option("--operator", default="", help="The operator who holds the key (default: the one named NAME).")
@ROOT_KEY_OPTION
@json_option
def approvers_add(name: str, public_key: str, operator: str, root_key: Path | None, as_json: bool) -> None:
    """Trust PUBKEY (from `bc approve keygen`) as approver NAME, held by an operator; nodes get it with their bundle.

    With approvers present this is a quorum change that the current approvers must sign first. With the
    root key kept off the bc serve host, pass it with --root-key: it signs the change here.
    """

    async def send(c: AdminClient, sig: bytes, preview: bool) -> admin_pb2.ApproverSet:
        return await c.add_approver(name, public_key, operator=operator, root_signature=sig, preview=preview)

    _show_approvers(propose_change(send, root_key), as_json)


@approvers.command("remove")
@click.argument("name")
@click.option(
    "--threshold",
    "k",
    type=int,
    default=0,
    help="The k the same change sets: needed when fewer than k live approvers would be left.",
)
@ROOT_KEY_OPTION
@json_option
def approvers_remove(name: str, k: int, root_key: Path | None, as_json: bool) -> None:
    """Stop trusting approver NAME (its approvals stop counting on the nodes too).

    Refused when it would leave fewer live approvers than k, unless --threshold lowers k in the same change.
    """

    async def send(c: AdminClient, sig: bytes, preview: bool) -> admin_pb2.ApproverSet:
        return await c.remove_approver(name, root_signature=sig, preview=preview, threshold=k)

    _show_approvers(propose_change(send, root_key), as_json)


@approvers.command("withdraw")
@click.argument("change_id", metavar="CHANGE")
@json_option
def approvers_withdraw(change_id: str, as_json: bool) -> None:
    """Take back a pending quorum change you asked for (a newer change also supersedes it)."""
    if not is_change(change_id):
        raise UsageError(f"{change_id!r} is not a quorum change id (q-…); a batch is rejected with bc approve reject")
    c = call_admin(lambda cl: cl.withdraw_quorum_change(change_id))
    emit(as_json, c, f"withdrew quorum change {c.id}: {change_summary(c)}; the quorum settings stay as they are")


@approvers.command("threshold")
@click.argument("k", type=click.IntRange(1, MAX_THRESHOLD))  # bounded before the wire's int32 (issue 29)
@ROOT_KEY_OPTION
@json_option
def approvers_threshold(k: int, root_key: Path | None, as_json: bool) -> None:
    """How many distinct approvers (never the requester) a batch needs."""

    async def send(c: AdminClient, sig: bytes, preview: bool) -> admin_pb2.ApproverSet:
        return await c.set_approver_threshold(k, root_signature=sig, preview=preview)

    _show_approvers(propose_change(send, root_key), as_json)


@approvers.command("allowance")
@click.argument("per_hour", type=click.IntRange(0, MAX_ALLOWANCE))
@ROOT_KEY_OPTION
@json_option
def approvers_allowance(per_hour: int, root_key: Path | None, as_json: bool) -> None:
    """Destructive commands a node may run without a batch per rolling hour of its clock (default 0)."""

    async def send(c: AdminClient, sig: bytes, preview: bool) -> admin_pb2.ApproverSet:
        return await c.set_unbatched_allowance(per_hour, root_signature=sig, preview=preview)

    _show_approvers(propose_change(send, root_key), as_json)


# -- bc batch --------------------------------------------------------------------------------


@click.group("batch")
def batch() -> None:
    """Destructive commands on a set of nodes, held until a quorum of approvers signs."""


@batch.command("create")
@click.option("--kind", required=True, help="A destructive kind (gpu.reset, node.reboot, ...).")
@click.option("--nodes", "nodes_csv", required=True, help="Comma-separated node ids.")
@click.option("--payload", default="{}", metavar="JSON|@FILE", help="The payload as JSON, @FILE or @- (stdin).")
@click.option("--reason", default="", help="Why, for the approvers.")
@click.option("--not-after", default="1h", show_default=True, help="How long the batch may wait and run.")
@json_option
def batch_create(kind: str, nodes_csv: str, payload: str, reason: str, not_after: str, as_json: bool) -> None:
    """Create a batch: its commands are enqueued held until approved."""
    nodes = [n.strip() for n in nodes_csv.split(",") if n.strip()]
    not_after_s = parse_duration(not_after)
    text = read_json_object(f"the {kind} payload", payload)
    b = call_admin(lambda c: c.create_batch(kind, nodes, text, reason=reason, not_after_s=round(not_after_s)))
    emit(
        as_json,
        b,
        lambda: lines(
            f"batch {b.id}: {scope_summary(b)}, waiting for {b.threshold} approvals",
            f"approvers: bc approve show {b.id}; bc approve sign {b.id} --key FILE",
        ),
    )


@batch.command("list")
@click.option("--state", type=click.Choice(["pending", "approved", "rejected", "withdrawn", "expired"]), default=None)
@json_option
def batch_list(state: str | None, as_json: bool) -> None:
    """Batches, newest first."""
    batches = call_admin(lambda c: c.list_batches(state=state or ""))
    rows = [(b.id, b.state, cell(scope_summary(b), width=60), f"{b.approvals}/{b.threshold}") for b in batches]
    emit(as_json, batches, render_table(("BATCH", "STATE", "SCOPE", "APPROVALS"), rows) if rows else "no batches")


@batch.command("show")
@click.argument("batch_id", metavar="BATCH")
@json_option
def batch_show(batch_id: str, as_json: bool) -> None:
    """One batch, its leaves and decisions."""
    _show_batch(batch_id, as_json)


# -- quorum changes --------------------------------------------------------------------------------


def is_change(id_: str) -> bool:
    return id_.startswith("q-")


def change_digests(c: admin_pb2.QuorumChangeInfo) -> tuple[bytes, bytes]:
    """Both settings' digests, computed here from the settings the server showed (never taken from it)."""
    if c.to_settings.version != c.from_settings.version + 1:
        raise UsageError(f"quorum change {c.id} does not move the settings' version by one: refusing to sign")
    return q.settings_digest(c.from_settings), q.settings_digest(c.to_settings)


def change_summary(c: admin_pb2.QuorumChangeInfo) -> str:
    return q.describe_change(c.from_settings, c.to_settings)


def render_change(c: admin_pb2.QuorumChangeInfo) -> Lines:
    fields: list[tuple[str, object]] = [
        ("quorum change", c.id),
        ("state", c.state),
        ("does", change_summary(c)),
        ("requested by", c.requested_by),
        ("approvals", f"{c.approvals} of {c.threshold} (of the approvers below, none of {c.requested_by}'s)"),
        ("expires", format_time_ms(c.not_after_ms)),
    ]
    parts: list[Lines] = [render_fields(fields)]
    rows = [(a.name, a.operator or "(none)", a.key_id[:23] + "…") for a in c.from_settings.approver_keys]
    parts.append(lines("WHO MAY SIGN (THE CURRENT APPROVERS)", render_table(("APPROVER", "OPERATOR", "KEY"), rows)))
    if c.decisions:
        drows = [(d.name, d.operator, d.decision, format_age(d.at_age_ms), cell(d.reason)) for d in c.decisions]
        parts.append(lines("DECISIONS", render_table(("APPROVER", "SENT BY", "DECISION", "WHEN", "REASON"), drows)))
    return paragraphs(*parts)


def _sign_change(change_id: str, key: ed25519.Ed25519PrivateKey, yes: bool, as_json: bool) -> None:
    c = call_admin(lambda cl: cl.get_quorum_change(change_id))
    if c.state != "pending":
        raise UsageError(f"quorum change {change_id} is {c.state}; there is nothing to sign")
    from_digest, to_digest = change_digests(c)
    echo(render_change(c), err=True)
    if not yes:
        if not sys.stdin.isatty():
            raise UsageError(f"not a terminal: add --yes to approve quorum change {c.id}")
        if not confirm(f"approve: {change_summary(c)}?", err=True):
            raise UsageError(f"did not approve quorum change {c.id}")
    sig = key.sign(q.change_message(c.id, from_digest, to_digest, c.requested_by))
    kid = q.key_id(public_raw(key))
    after = call_admin(lambda cl: cl.decide_quorum_change(c.id, kid, sig, approve=True))
    emit(
        as_json,
        after,
        f"signed quorum change {c.id}: {after.approvals} of {after.threshold} approvals; it is {after.state}",
    )


COMMANDS: tuple[click.Command, ...] = (approve, approvers, batch)
