"""Quorum batches and approver decisions as the Admin API shows them, and the approval the quorum counts.

Apart from the other mappers (`bc.control.reads.views`) because the quorum's own writes use them too: a batch is
decided by the same approval and the same rule as `bc batches show` displays (`batch_approval`, `batch_info`).
"""

from __future__ import annotations

from bc.pki import quorum
from bc.protocol.pb import admin_pb2, common_pb2
from bc.store import Row


def batch_state(row: Row, now_ms: int) -> str:
    """A batch's state as shown: a pending one past its expiry is `expired` (nothing stores that)."""
    state = str(row["state"])
    return "expired" if state == "pending" and int(row["not_after_ms"]) <= now_ms else state


def batch_approval(row: Row, leaf_count: int, decisions: list[Row]) -> common_pb2.BatchApproval:
    """The batch's approvals as `bc.pki.quorum.count_approvals` takes them: every stored approve decision."""
    approval = common_pb2.BatchApproval(
        batch_id=str(row["id"]),
        scope_root=bytes(row["scope_root"]),
        requested_by=str(row["requested_by"]),
        leaf_count=leaf_count,
    )
    for d in decisions:
        if str(d["decision"]) == "approve":
            approval.signatures.add(
                key_id=str(d["key_id"]), expires_at_ms=int(d["expires_at_ms"]), signature=bytes(d["signature"])
            )
    return approval


def batch_info(
    row: Row,
    leaves: list[Row],
    decisions: list[Row],
    approvers: list[common_pb2.ApproverKey],
    now_ms: int,
) -> admin_pb2.BatchInfo:
    """A batch as the API shows it; `approvers` is the current approver set, read with the rows."""
    info = admin_pb2.BatchInfo(
        id=str(row["id"]),
        kind=str(row["kind"]),
        state=batch_state(row, now_ms),
        requested_by=str(row["requested_by"]),
        reason=str(row["reason"] or ""),
        scope_root=bytes(row["scope_root"]).hex(),
        payload_json=str(row["payload_json"] or "{}"),
        threshold=int(row["threshold"]),
        created_age_ms=max(0, now_ms - int(row["created_at_ms"])),
        not_after_ms=int(row["not_after_ms"]),
        dag_id=str(row["dag_id"] or ""),
        resolution=str(row["resolution"] or ""),
    )
    for leaf in leaves:
        info.leaves.add(
            index=int(leaf["idx"]),
            node_id=str(leaf["node_id"]),
            kind=str(leaf["kind"]),
            payload_digest=bytes(leaf["payload_digest"]).hex(),
            command_id=str(leaf["command_id"]),
            command_state=str(leaf["command_state"] or ""),
        )
    info.decisions.extend(decision_info(d, now_ms) for d in decisions)
    # What still counts, by the one rule that decides a batch (and that the node applies): every decision is
    # shown, but an expired approval, a removed approver's, a second one of an operator's, or the requester's
    # own does not count.
    tally = quorum.count_approvals(batch_approval(row, len(leaves), decisions), approvers, now_ms)
    info.approvals = len(tally.counted)
    return info


def decision_info(d: Row, now_ms: int) -> admin_pb2.BatchDecision:
    """An approver's decision on a batch or a quorum change (a quorum change's carry no expiry)."""
    return admin_pb2.BatchDecision(
        key_id=str(d["key_id"]),
        name=str(d["name"]),
        decision=str(d["decision"]),
        reason=str(d["reason"] or ""),
        at_age_ms=max(0, now_ms - int(d["at_ms"])),
        expires_at_ms=int(d.get("expires_at_ms") or 0),
        operator=str(d.get("operator") or ""),
    )
