"""The quorum settings — approver keys, k, the unbatched allowance — and how they change (docs/quorum.md).

These settings decide which destructive commands nodes run, so they change the
way TUF rotates its root. With approvers present, `bc approvers
add|remove|threshold|allowance` stores a pending *quorum change* from the
current settings S to the new S'. It applies only once
`change_threshold(S)` of S's own approvers have signed both digests
(`bc approve sign q-…`), each approval sent under the certificate of the
operator its key is registered to, none by the requester. Nodes check the same
signatures, carried in the trust bundle beside the root's, before they take
S'. Every change also carries the command-signing root's own signature of its
step (`RootSeal`): made here when the root key is on this host, else by the
operator's CLI from the exported file (`--root-key`), so that nodes take it
in a bundle the worker signed. With no approvers yet a change applies at once: the signing root alone
guards it (bootstrap).

One change is pending at a time: each moves from the current settings, so a
second would be stale the moment the first applied. A newer change therefore
supersedes the pending one, and its proposer may withdraw it (`withdraw`), so
a forgotten change never blocks the next for its 24 hours. No change may leave
the quorum unable to pass what it asks (`bc.control.quorum.liveness`: a
viewer's key, a removal that leaves fewer live approvers than k). What nodes hold is
`effective(...)`: with no approvers, k and the allowance are 0 (nothing is
enforced), which is also what nodes of earlier versions hold, so an upgrade
changes nothing they see.
"""

from __future__ import annotations

import base64
import random
from collections.abc import Callable
from dataclasses import dataclass

from bc.control.base.bus import Bus
from bc.control.base.events import publish
from bc.control.quorum import liveness as liveness
from bc.control.quorum import views as quorum_views
from bc.errors import Conflict, NotFound, Unauthenticated, UsageError
from bc.pki import quorum as q
from bc.pki.identity import check_safe_name
from bc.protocol.pb import admin_pb2, common_pb2
from bc.seams.ids import ulid
from bc.store import Row, Store, Tx
from bc.store import operators as ops_sql
from bc.store import quorum as q_sql
from bc.store import settings as settings_sql

THRESHOLD_KEY = "quorum.threshold"
ALLOWANCE_KEY = "quorum.unbatched_destructive_per_hour"
VERSION_KEY = "quorum.version"
MAX_ALLOWANCE = 1000
DEFAULT_THRESHOLD = 2
MAX_THRESHOLD = 100
CHANGE_TTL_S = 24 * 3600.0
CHAIN_LENGTH = 32
"""How many applied changes the trust bundle carries: a node further behind keeps its settings (re-join it)."""
MAX_REASON = 500


@dataclass(frozen=True)
class ApproverSet:
    """What the store holds: the approver rows, k, the allowance and the settings' version."""

    approvers: list[Row]
    threshold: int
    unbatched_per_hour: int = 0
    version: int = 0


def approver_keys(rows: list[Row]) -> list[common_pb2.ApproverKey]:
    return [
        common_pb2.ApproverKey(
            key_id=str(r["key_id"]),
            public_key=bytes(r["public_key"]),
            name=str(r["name"]),
            operator=str(r["operator"] or ""),
        )
        for r in rows
    ]


def effective(s: ApproverSet) -> common_pb2.QuorumSettings:
    """The settings nodes hold: with no approvers nothing is enforced, so k and the allowance are 0."""
    out = common_pb2.QuorumSettings(version=s.version)
    if s.approvers:
        out.approver_keys.extend(approver_keys(s.approvers))
        out.quorum_k, out.unbatched_destructive_per_hour = s.threshold, s.unbatched_per_hour
    return out


async def threshold(tx: Tx) -> int:
    v = await settings_sql.get(tx, THRESHOLD_KEY)
    return int(v) if v else DEFAULT_THRESHOLD


async def stored(tx: Tx) -> ApproverSet:
    allowance = int(await settings_sql.get(tx, ALLOWANCE_KEY) or 0)
    version = int(await settings_sql.get(tx, VERSION_KEY) or 0)
    return ApproverSet(await q_sql.list_approvers(tx), await threshold(tx), allowance, version)


async def approver_set(store: Store) -> ApproverSet:
    async with store.transaction(write=False) as tx:
        return await stored(tx)


async def trust_state(store: Store) -> tuple[common_pb2.QuorumSettings, list[common_pb2.QuorumChange]]:
    """What the trust bundle carries: the effective settings and the latest applied changes, oldest first."""
    async with store.transaction(write=False) as tx:
        current = effective(await stored(tx))
        chain = [common_pb2.QuorumChange.FromString(b) for b in await q_sql.applied_chain(tx, CHAIN_LENGTH)]
    return current, chain


# -- what an operator asks for ------------------------------------------------------------------


@dataclass(frozen=True)
class AddApprover:
    name: str
    public_key_b64: str
    operator: str = ""  # empty: the operator named like the approver


@dataclass(frozen=True)
class RemoveApprover:
    name: str
    threshold: int = 0  # the k the same change sets (0: keep k); needed when k live approvers would not be left


@dataclass(frozen=True)
class SetThreshold:
    k: int


@dataclass(frozen=True)
class SetAllowance:
    per_hour: int


Edit = AddApprover | RemoveApprover | SetThreshold | SetAllowance


def _check(edit: Edit) -> Edit:
    """Everything about the request that needs no store; AddApprover comes back with its operator filled in."""
    if isinstance(edit, AddApprover):
        check_safe_name("approver name", edit.name)
        operator = edit.operator or edit.name
        check_safe_name("operator name", operator)
        try:
            q.parse_public_key(edit.public_key_b64)
        except ValueError as e:
            raise UsageError(f"{e}; pass the public_key that `bc approve keygen` printed") from None
        return AddApprover(edit.name, edit.public_key_b64, operator)
    if isinstance(edit, RemoveApprover):
        if not edit.name:
            raise UsageError("name the approver to remove")
        if edit.threshold and not 1 <= edit.threshold <= MAX_THRESHOLD:
            raise UsageError(f"the threshold must be between 1 and {MAX_THRESHOLD}, not {edit.threshold}")
    elif isinstance(edit, SetThreshold):
        if not 1 <= edit.k <= MAX_THRESHOLD:
            raise UsageError(f"the threshold must be between 1 and {MAX_THRESHOLD}, not {edit.k}")
    elif not 0 <= edit.per_hour <= MAX_ALLOWANCE:
        raise UsageError(f"the unbatched allowance must be between 0 and {MAX_ALLOWANCE} an hour, not {edit.per_hour}")
    return edit


async def _edited(tx: Tx, cur: ApproverSet, edit: Edit) -> tuple[list[common_pb2.ApproverKey], int, int]:
    """The stored values after `edit`: (approver keys, k, allowance); refusals that need the store."""
    keys = approver_keys(cur.approvers)
    k, allowance = cur.threshold, cur.unbatched_per_hour
    if isinstance(edit, AddApprover):
        raw = q.parse_public_key(edit.public_key_b64)
        key_id = q.key_id(raw)
        for a in keys:
            if a.name == edit.name or a.key_id == key_id:
                raise Conflict(f"approver {a.name} already has this name or key ({a.key_id})")
            if a.operator == edit.operator:
                raise Conflict(
                    f"operator {edit.operator} already holds approver key {a.name}: one key per operator,"
                    " so that one person is never two approvals"
                )
        op = await ops_sql.get(tx, edit.operator)
        if op is None:
            raise NotFound(
                f"no operator named {edit.operator!r}: add one first (bc operators add {edit.operator})"
                " or name the key's holder with --operator"
            )
        if op["revoked_at_ms"] is not None:
            raise Conflict(f"operator {edit.operator} is revoked and cannot hold an approver key")
        viewer = liveness.refuse_approver_holder(edit.operator, _holder(op))
        if viewer is not None:
            raise UsageError(viewer)
        keys.append(common_pb2.ApproverKey(key_id=key_id, public_key=raw, name=edit.name, operator=edit.operator))
    elif isinstance(edit, RemoveApprover):
        kept = [a for a in keys if a.name != edit.name]
        if len(kept) == len(keys):
            raise NotFound(f"no approver named {edit.name!r}")
        keys = kept
        k = edit.threshold or k
    elif isinstance(edit, SetThreshold):
        k = edit.k
    else:
        allowance = edit.per_hour
    return keys, k, allowance


def _holder(row: Row) -> liveness.Holder:
    return liveness.Holder(str(row["role"]), row["revoked_at_ms"] is not None)


async def holders(tx: Tx) -> dict[str, liveness.Holder]:
    """Every operator's role and revocation: what decides which approver keys are live."""
    return {str(r["name"]): _holder(r) for r in await ops_sql.list_all(tx)}


async def check_stays_live(tx: Tx, frm: common_pb2.QuorumSettings, to: common_pb2.QuorumSettings) -> None:
    """Conflict when the change frm → to would leave the quorum unable to pass what it asks
    (`bc.control.quorum.liveness`)."""
    why = liveness.refuse_change(frm, to, await holders(tx))
    if why is not None:
        raise Conflict(why)


def _settings(keys: list[common_pb2.ApproverKey], k: int, allowance: int, version: int) -> common_pb2.QuorumSettings:
    out = common_pb2.QuorumSettings(version=version)
    if keys:
        out.approver_keys.extend(keys)
        out.quorum_k, out.unbatched_destructive_per_hour = k, allowance
    return out


def _eligible(s: common_pb2.QuorumSettings, requested_by: str) -> int:
    """How many distinct people (operators; a key from before operators counts alone) could approve."""
    people = {a.operator or f"key:{a.key_id}" for a in s.approver_keys if not q.is_requesters(a, requested_by)}
    return len(people)


@dataclass(frozen=True)
class Proposed:
    change_id: str  # "" when nothing nodes hold changed (e.g. k while there are no approvers)
    state: str  # applied | pending | unchanged | preview
    frm: common_pb2.QuorumSettings | None = None  # a preview's two settings: what the root signs
    to: common_pb2.QuorumSettings | None = None


@dataclass(frozen=True)
class RootSeal:
    """The command-signing root as a quorum change needs it: nodes take a change in a worker-signed bundle
    only with the root's own signature of its step (`bc.pki.quorum.root_change_message`)."""

    public_key: bytes  # raw Ed25519
    sign: Callable[[bytes], bytes] | None  # None: the root key is not on this host (`bc pki root remove`)


ROOT_OFFLINE = (
    "the command-signing root key is not on this host: pass --root-key FILE (the exported root key),"
    " so that the CLI signs this change with it"
)


def root_signature(
    root: RootSeal | None, given: bytes, frm: common_pb2.QuorumSettings, to: common_pb2.QuorumSettings
) -> bytes:
    """The root's signature of the step frm → to: the one the operator's CLI made, else made here; b"" when
    command signing is off (nodes hold no root). A UsageError when neither is possible or it does not verify."""
    if root is None:
        return b""
    msg = q.root_change_message(q.settings_digest(frm), q.settings_digest(to))
    if given:
        if not q.verify(root.public_key, msg, given):
            raise UsageError(
                "the root signature does not cover this change: the --root-key file is not this install's root,"
                " or the quorum settings moved meanwhile (ask again)"
            )
        return given
    if root.sign is None:
        raise UsageError(ROOT_OFFLINE)
    return root.sign(msg)


async def propose(
    store: Store,
    bus: Bus | None,
    edit: Edit,
    requested_by: str,
    rng: random.Random,
    *,
    root: RootSeal | None = None,
    given_root_signature: bytes = b"",
    preview: bool = False,
) -> Proposed:
    """Apply `edit` at once when no approvers guard the settings; else store it as a pending change.

    `root` is the command-signing root (None with signing off): each change carries its signature of
    the step, the operator's (`given_root_signature`, made with `--root-key`) or made here. `preview`
    stores nothing and returns both settings, for the operator's CLI to sign.
    """
    edit = _check(edit)
    now_ms = await store.now_ms()
    async with store.transaction() as tx:
        cur = await stored(tx)
        keys, k, allowance = await _edited(tx, cur, edit)
        frm = effective(cur)
        to = _settings(keys, k, allowance, cur.version)
        if q.settings_digest(to) == q.settings_digest(frm):
            if preview:
                return Proposed("", "unchanged")
            # Nothing nodes hold moves (k or the allowance with no approvers, or the value it already has).
            await settings_sql.put(tx, THRESHOLD_KEY, str(k))
            await settings_sql.put(tx, ALLOWANCE_KEY, str(allowance))
            await publish(tx, bus, "quorum.unchanged", "", {"threshold": k, "per_hour": allowance}, now_ms)
            return Proposed("", "unchanged")
        to.version = cur.version + 1
        need = q.change_threshold(frm)
        change_id = "q-" + ulid(now_ms / 1000, rng)
        await check_stays_live(tx, frm, to)
        if need and _eligible(frm, requested_by) < need:
            raise Conflict(
                f"this change needs {need} approvals of the current approvers, and only"
                f" {_eligible(frm, requested_by)} are not {requested_by}'s own: ask another operator to request it"
            )
        if preview:
            return Proposed("", "preview", frm, to)
        root_sig = root_signature(root, given_root_signature, frm, to)
        pending = await q_sql.open_change(tx, now_ms) if need else None
        if pending is not None:
            # A newer change supersedes the pending one (both move from the same settings, so only one can
            # ever apply): a forgotten or stuck change never blocks the quorum for its 24 hours.
            await _settle_superseded(tx, bus, pending, change_id, requested_by, now_ms)
        await q_sql.insert_change(
            tx,
            root_signature=root_sig,
            id_=change_id,
            requested_by=requested_by,
            summary=q.describe_change(frm, to),
            from_settings=frm.SerializeToString(deterministic=True),
            to_settings=to.SerializeToString(deterministic=True),
            threshold=need,
            to_version=to.version,
            now_ms=now_ms,
            not_after_ms=now_ms + round(CHANGE_TTL_S * 1000),
        )
        data = {"summary": q.describe_change(frm, to), "requested_by": requested_by, "needs": need}
        await publish(tx, bus, "quorum.change-requested", change_id, data, now_ms)
        if need:
            return Proposed(change_id, "pending")
        # Bootstrap: no approvers to ask, the signing root alone guards this change.
        change = common_pb2.QuorumChange(
            change_id=change_id,
            requested_by=requested_by,
            from_digest=q.settings_digest(frm),
            settings=to,
            root_signature=root_sig,
        )
        await _apply(tx, bus, change_id, change, k, allowance, [], now_ms)
    return Proposed(change_id, "applied")


async def _apply(
    tx: Tx,
    bus: Bus | None,
    change_id: str,
    change: common_pb2.QuorumChange,
    k: int,
    allowance: int,
    approvers: list[str],
    now_ms: int,
) -> None:
    """Store the change's settings and its approval, which nodes walk from what they hold."""
    to = change.settings
    current = {str(r["key_id"]) for r in await q_sql.list_approvers(tx)}
    wanted = {a.key_id for a in to.approver_keys}
    for key_id in sorted(current - wanted):
        await q_sql.remove_approver(tx, key_id)
    for a in to.approver_keys:
        if a.key_id not in current:
            await q_sql.add_approver(tx, a.key_id, a.name, bytes(a.public_key), a.operator, now_ms)
    await settings_sql.put(tx, THRESHOLD_KEY, str(k))
    await settings_sql.put(tx, ALLOWANCE_KEY, str(allowance))
    await settings_sql.put(tx, VERSION_KEY, str(to.version))
    await q_sql.settle_change(tx, change_id, "applied", change.SerializeToString(deterministic=True), now_ms)
    data = {"version": to.version, "approvers": approvers, "requested_by": change.requested_by}
    await publish(tx, bus, "quorum.changed", change_id, data, now_ms)


# -- approving and rejecting a change --------------------------------------------------------------


def _approver_of(s: common_pb2.QuorumSettings, key_id: str) -> common_pb2.ApproverKey:
    for a in s.approver_keys:
        if a.key_id == key_id:
            return a
    raise UsageError(f"the key {key_id} is not an approver key of the quorum this change moves from")


def check_holder(approver: common_pb2.ApproverKey, caller: str) -> None:
    """A decision is taken only under the certificate of the operator the key is registered to.

    A key added before operators existed is registered to nobody; its decisions come under any certificate.
    """
    if approver.operator and approver.operator != caller:
        raise Unauthenticated(
            f"approver key {approver.name} is registered to operator {approver.operator}: its decisions count only"
            f" when sent under {approver.operator}'s certificate, not {caller}'s"
        )


def check_approver(approver: common_pb2.ApproverKey, caller: str, requested_by: str, what: str) -> None:
    """`check_holder`, and never the requester: not their certificate, not a key registered to or named like them."""
    check_holder(approver, caller)
    if caller == requested_by or q.is_requesters(approver, requested_by):
        raise UsageError(f"{requested_by} asked for {what}: the requester's own approval does not count")


async def decide(
    store: Store,
    bus: Bus | None,
    change_id: str,
    key_id: str,
    signature: bytes,
    *,
    approve: bool,
    caller: str,
    reason: str = "",
) -> None:
    """Record one approver's signed decision; apply the change at its threshold, fail it on a rejection."""
    if len(reason) > MAX_REASON:
        raise UsageError(f"the reason is longer than {MAX_REASON} characters")
    now_ms = await store.now_ms()
    async with store.transaction() as tx:
        row = await q_sql.get_change(tx, change_id, store.for_update())
        if row is None:
            raise NotFound(f"no quorum change named {change_id!r}")
        if str(row["state"]) != "pending":
            raise Conflict(f"quorum change {change_id} is already {row['state']}")
        if int(row["not_after_ms"]) <= now_ms:
            raise Conflict(f"quorum change {change_id} expired; ask for it again")
        frm = common_pb2.QuorumSettings.FromString(bytes(row["from_settings"]))
        to = common_pb2.QuorumSettings.FromString(bytes(row["to_settings"]))
        requested_by = str(row["requested_by"])
        approver = _approver_of(frm, key_id)
        check_holder(approver, caller)
        to_digest = q.settings_digest(to)
        if approve:
            check_approver(approver, caller, requested_by, f"quorum change {change_id}")
            msg = q.change_message(change_id, q.settings_digest(frm), to_digest, requested_by)
        else:
            if not reason.strip():
                raise UsageError("a rejection needs a reason (--reason)")
            msg = q.change_rejection_message(change_id, to_digest, reason)
        if not q.verify(bytes(approver.public_key), msg, signature):
            raise UsageError(f"the signature does not verify with {approver.name}'s key for this change")
        if not await q_sql.insert_change_decision(
            tx,
            change_id=change_id,
            key_id=key_id,
            name=approver.name,
            operator=caller,
            decision="approve" if approve else "reject",
            signature=signature,
            reason=reason,
            now_ms=now_ms,
        ):
            raise Conflict(f"{approver.name} has already decided on quorum change {change_id}")
        data = {"key_id": key_id, "name": approver.name, "reason": reason}
        await publish(
            tx, bus, "quorum.change-approval" if approve else "quorum.change-rejection", change_id, data, now_ms
        )
        if not approve:
            await q_sql.settle_change(tx, change_id, "rejected", None, now_ms)
            await publish(tx, bus, "quorum.change-rejected", change_id, {"by": approver.name, "reason": reason}, now_ms)
            return
        change, tally = change_tally(change_id, requested_by, frm, to, await q_sql.change_decisions(tx, change_id))
        change.root_signature = bytes(row["root_signature"] or b"")
        if len(tally.counted) < int(row["threshold"]):
            return
        cur = await stored(tx)
        if q.settings_digest(effective(cur)) != change.from_digest:
            await q_sql.settle_change(tx, change_id, "superseded", None, now_ms)
            await publish(tx, bus, "quorum.change-superseded", change_id, {}, now_ms)
            return
        # The operators may have changed since it was asked for (one revoked): it must still leave a live quorum.
        await check_stays_live(tx, frm, to)
        kept = [s for s in change.signatures if s.key_id in tally.counted]
        del change.signatures[:]
        change.signatures.extend(kept)
        # With approvers left, k and the allowance are the change's; removing the last keeps the stored ones.
        k = to.quorum_k if to.approver_keys else cur.threshold
        allowance = to.unbatched_destructive_per_hour if to.approver_keys else cur.unbatched_per_hour
        await _apply(tx, bus, change_id, change, k, allowance, tally.counted, now_ms)


async def _settle_superseded(
    tx: Tx, bus: Bus | None, pending: Row, by_change: str, requested_by: str, now_ms: int
) -> None:
    old = str(pending["id"])
    await q_sql.settle_change(tx, old, "superseded", None, now_ms)
    data = {"by": by_change, "requested_by": requested_by, "was_requested_by": str(pending["requested_by"])}
    await publish(tx, bus, "quorum.change-superseded", old, data, now_ms)


async def withdraw(store: Store, bus: Bus | None, change_id: str, caller: str) -> None:
    """The proposer takes back a pending change: it becomes `withdrawn` and no approval of it counts any more."""
    now_ms = await store.now_ms()
    async with store.transaction() as tx:
        row = await q_sql.get_change(tx, change_id, store.for_update())
        if row is None:
            raise NotFound(f"no quorum change named {change_id!r}")
        if str(row["state"]) != "pending" or int(row["not_after_ms"]) <= now_ms:
            state = "expired" if str(row["state"]) == "pending" else str(row["state"])
            raise Conflict(f"quorum change {change_id} is already {state}; there is nothing to withdraw")
        requested_by = str(row["requested_by"])
        if caller != requested_by:
            raise Unauthenticated(
                f"quorum change {change_id} was asked for by {requested_by}: only they may withdraw it"
                " (a newer change supersedes it)"
            )
        await q_sql.settle_change(tx, change_id, "withdrawn", None, now_ms)
        await publish(tx, bus, "quorum.change-withdrawn", change_id, {"by": caller}, now_ms)


# -- reads ---------------------------------------------------------------------------------------------


def set_info(s: ApproverSet, now_ms: int) -> admin_pb2.ApproverSet:
    return admin_pb2.ApproverSet(
        approvers=[
            admin_pb2.ApproverInfo(
                key_id=str(r["key_id"]),
                name=str(r["name"]),
                public_key=base64.b64encode(bytes(r["public_key"])).decode(),
                added_age_ms=max(0, now_ms - int(r["added_at_ms"])),
                operator=str(r["operator"] or ""),
            )
            for r in s.approvers
        ],
        threshold=s.threshold,
        unbatched_destructive_per_hour=s.unbatched_per_hour,
        version=s.version,
    )


def change_tally(
    change_id: str,
    requested_by: str,
    frm: common_pb2.QuorumSettings,
    to: common_pb2.QuorumSettings,
    decisions: list[Row],
) -> tuple[common_pb2.QuorumChange, q.Tally]:
    """The change as nodes will check it, and its approvals counted by the one rule
    (`bc.pki.quorum.count_change_approvals`): what decides a change is what `bc approvers changes` shows."""
    change = common_pb2.QuorumChange(
        change_id=change_id, requested_by=requested_by, from_digest=q.settings_digest(frm), settings=to
    )
    for d in decisions:
        if str(d["decision"]) == "approve":
            change.signatures.add(key_id=str(d["key_id"]), signature=bytes(d["signature"]))
    return change, q.count_change_approvals(change, frm)


def preview_info(
    frm: common_pb2.QuorumSettings, to: common_pb2.QuorumSettings, requested_by: str
) -> admin_pb2.QuorumChangeInfo:
    """A change not stored yet (`preview`): both settings, for the operator's CLI to sign with the root."""
    return admin_pb2.QuorumChangeInfo(
        state="preview",
        summary=q.describe_change(frm, to),
        requested_by=requested_by,
        from_settings=frm,
        to_settings=to,
        threshold=q.change_threshold(frm),
    )


def change_info(row: Row, decisions: list[Row], now_ms: int) -> admin_pb2.QuorumChangeInfo:
    state = str(row["state"])
    if state == "pending" and int(row["not_after_ms"]) <= now_ms:
        state = "expired"
    info = admin_pb2.QuorumChangeInfo(
        id=str(row["id"]),
        state=state,
        summary=str(row["summary"]),
        requested_by=str(row["requested_by"]),
        threshold=int(row["threshold"]),
        created_age_ms=max(0, now_ms - int(row["created_at_ms"])),
        not_after_ms=int(row["not_after_ms"]),
    )
    info.from_settings.ParseFromString(bytes(row["from_settings"]))
    info.to_settings.ParseFromString(bytes(row["to_settings"]))
    info.decisions.extend(quorum_views.decision_info(d, now_ms) for d in decisions)
    _, tally = change_tally(info.id, info.requested_by, info.from_settings, info.to_settings, decisions)
    info.approvals = len(tally.counted)
    return info


async def get_change(store: Store, change_id: str) -> admin_pb2.QuorumChangeInfo:
    now_ms = await store.now_ms()
    async with store.transaction(write=False) as tx:
        row = await q_sql.get_change(tx, change_id)
        if row is None:
            raise NotFound(f"no quorum change named {change_id!r}")
        return change_info(row, await q_sql.change_decisions(tx, change_id), now_ms)


async def list_changes(store: Store, state: str = "") -> list[admin_pb2.QuorumChangeInfo]:
    now_ms = await store.now_ms()
    out = []
    async with store.transaction(write=False) as tx:
        for row in await q_sql.list_changes(tx, "pending" if state == "expired" else state):
            out.append(change_info(row, await q_sql.change_decisions(tx, str(row["id"])), now_ms))
    return [c for c in out if not state or c.state == state]
