"""A health policy version's pre-approvals on the server: the batch the approvers sign, its standing, its use.

A version that names pre-approvals (`preapprove`, `bc.pki.preapproval`) is stored like any other, and, when
approvers exist, opens a one-leaf batch of kind `health.preapprove` over the version's exact text (`open_batch`):
`bc approve list` and the TUI's approvals screen show it as they show every batch, and `bc approve sign`
recomputes its leaf from the text it shows. Until k approvers signed it, the version pre-approves nothing. A
newer version withdraws the older one's batch if it still waits (its text is not the policy in force any more).

`standing` says where the version in force stands (`bc health policy show`); `use` is the reconciler's
question for one remediation step: may it attach the signed version instead of asking for a batch? Its answer
is advice only: the node checks the signatures, the kind, its own labels and the expiry itself
(`agent/quorum.py`), so neither this module nor a gateway can make a pre-approval count.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass

from bc.control.base.bus import Bus
from bc.control.base.events import publish
from bc.control.health import policy as pol
from bc.control.quorum import approvers as appr
from bc.control.quorum import batches as quorum
from bc.errors import ProtocolError
from bc.pki import preapproval as pre
from bc.pki import quorum as q
from bc.protocol import canonical
from bc.protocol.pb import common_pb2
from bc.seams.ids import ulid
from bc.store import Row, Tx
from bc.store import health as health_sql
from bc.store import quorum as q_sql

NONE, NO_APPROVERS, PENDING, APPROVED = "none", "no-approvers", "pending", "approved"
"""A version's standing; besides these, its batch's own end: rejected, withdrawn, expired."""


@dataclass(frozen=True)
class Standing:
    version: int
    entries: tuple[pre.Preapproval, ...]
    state: str
    batch_id: str = ""
    approvals: int = 0
    threshold: int = 0

    @property
    def in_force(self) -> bool:
        return self.state == APPROVED

    def why_not(self) -> str:
        """Why the version pre-approves nothing now (when it does not)."""
        v = f"health policy v{self.version}"
        if self.state == NONE:
            return f"{v} pre-approves nothing"
        if self.state == NO_APPROVERS:
            return f"{v}'s pre-approvals were never signed (no approvers existed when it was set)"
        if self.state == PENDING:
            return f"{v}'s pre-approval batch {self.batch_id} holds {self.approvals} of {self.threshold} approvals"
        return f"{v}'s pre-approval batch {self.batch_id} is {self.state}"


async def open_batch(
    tx: Tx, bus: Bus | None, rng: random.Random | None, version: int, policy: pol.Policy, set_by: str, now_ms: int
) -> str:
    """The version's pre-approval batch ("" when it names none or no approvers exist), after withdrawing the
    previous versions' batches still waiting; each step an event."""
    for old in await health_sql.preapproval_batches(tx, version):
        batch = await q_sql.get_batch(tx, str(old["preapproval_batch"]))
        if batch is not None and str(batch["state"]) == PENDING:  # its one leaf runs no command: nothing to cancel
            await q_sql.withdraw_batch(tx, str(batch["id"]), now_ms)
            why = {"reason": f"superseded by health policy v{version}"}
            await publish(tx, bus, "batch.withdrawn", str(batch["id"]), why, now_ms)
    if not policy.preapprove:
        return ""
    entries = [p.doc() for p in policy.preapprove]
    if not await quorum.has_approvers(tx):
        data = {"version": version, "preapprove": entries, "why": "no approvers exist to sign it"}
        await publish(tx, bus, "health.preapproval.unsigned", f"v{version}", data, now_ms)
        return ""
    await quorum.check_can_approve(tx, set_by)
    if rng is None:
        raise ProtocolError("opening a pre-approval batch needs the Random passed in (bc.assembly)")
    text = policy.text()
    batch_id = "b-" + ulid(now_ms / 1000, rng)
    summary = "; ".join(f"{p.describe()} until {p.expires_at_ms}" for p in policy.preapprove)
    await q_sql.insert_batch(
        tx,
        id_=batch_id,
        kind=pre.BATCH_KIND,
        requested_by=set_by,
        reason=f"health policy v{version} pre-approves {summary}"[:500],
        payload_json=canonical.canonical_json({"version": version, "policy_json": text}),
        scope_root=pre.scope_root(version, text),
        threshold=await appr.threshold(tx),
        now_ms=now_ms,
        # The approvals count until the last entry expires (each entry's own expiry is checked too).
        not_after_ms=max(p.expires_at_ms for p in policy.preapprove),
    )
    # No command runs for this leaf: a remediation in the pool carries the approved version (the gateway).
    await q_sql.insert_leaf(tx, batch_id, 0, pre.LEAF_SUBJECT, pre.BATCH_KIND, pre.policy_digest(version, text), "")
    await health_sql.set_preapproval_batch(tx, version, batch_id)
    root = pre.scope_root(version, text).hex()
    created = {"kind": pre.BATCH_KIND, "nodes": [], "requested_by": set_by, "policy_version": version}
    await publish(tx, bus, "batch.created", batch_id, created | {"scope_root": root}, now_ms)
    data = {"version": version, "batch_id": batch_id, "preapprove": entries, "requested_by": set_by}
    await publish(tx, bus, "health.preapproval.requested", f"v{version}", data, now_ms)
    return batch_id


async def standing(tx: Tx, row: Row | None, policy: pol.Policy, now_ms: int) -> Standing:
    """Where the version in force (`row`: its health_policies row, None for the defaults) stands now."""
    version = int(row["version"]) if row is not None else 0
    batch_id = str(row["preapproval_batch"] or "") if row is not None else ""
    if not policy.preapprove:
        return Standing(version, (), NONE)
    if not batch_id:
        return Standing(version, policy.preapprove, NO_APPROVERS)
    batch = await q_sql.get_batch(tx, batch_id)
    if batch is None:
        return Standing(version, policy.preapprove, "missing", batch_id)
    threshold = int(batch["threshold"])
    state = str(batch["state"])
    if state == PENDING:
        progress = await quorum.approval_progress(tx, batch_id, now_ms)
        if progress is None:
            return Standing(version, policy.preapprove, "expired", batch_id, 0, threshold)
        return Standing(version, policy.preapprove, PENDING, batch_id, progress[0], threshold)
    if state != APPROVED or batch["approval"] is None:
        return Standing(version, policy.preapprove, state, batch_id, 0, threshold)
    # Approved: its signatures count while they have not expired and their keys are still approvers (as a node
    # holding the same approver set counts them).
    approval = common_pb2.BatchApproval.FromString(bytes(batch["approval"]))
    keys = appr.approver_keys(await q_sql.list_approvers(tx))
    counted = len(q.count_approvals(approval, keys, now_ms).counted)
    need = max(1, await appr.threshold(tx))
    if counted < need:
        return Standing(version, policy.preapprove, "expired", batch_id, counted, need)
    return Standing(version, policy.preapprove, APPROVED, batch_id, counted, need)


def entry_state(p: pre.Preapproval, s: Standing, now_ms: int) -> str:
    """One entry's standing for `bc health policy show`: in-force, waiting-for-approvals, expired, …"""
    if p.expires_at_ms <= now_ms:
        return "expired"
    if s.in_force:
        return "in-force"
    return {PENDING: "waiting-for-approvals", NO_APPROVERS: "no-approvers"}.get(s.state, s.state)


def use(s: Standing, kind: str, labels: Mapping[str, str], now_ms: int) -> tuple[int, str]:
    """(the version to attach, what it pre-approves) or (0, why a batch is asked for instead)."""
    if not s.in_force:
        return 0, s.why_not()
    p, why = pre.covering(s.entries, kind, labels, now_ms)
    if p is None:
        return 0, f"health policy v{s.version} does not pre-approve it: {why}"
    return s.version, f"pre-approved by health policy v{s.version} ({p.describe()}, batch {s.batch_id})"
