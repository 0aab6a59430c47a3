"""A compromised gateway against the destructive-batch quorum: real server, real agent, tampered frames.

The gateway (the production one, its links wrapped by the tamperer of
test_compromised_gateway) holds no key: it can mix approvals and proofs
between batches, strip or thin them, alter a leaf's payload or replay a leaf
that already ran. Every such command must end `rejected` (BATCH_UNAPPROVED, or
BAD_SIGNATURE where the signed body was touched) and nothing may run.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from agent.hw.fake import FakeHardware
from bc.protocol.pb import admin_pb2, common_pb2, session_pb2
from bc.protocol.pb.session_pb2 import GatewayMessage
from tests.integration.conftest import InprocLab
from tests.integration.operators_lab import Approver, approvers, sign
from tests.integration.test_compromised_gateway import (
    Tamperer,
    compromise,
    reset_request,
    rewrite_command_body,
    security_event,
    settled,
    until,
)

Tamper = Callable[[session_pb2.Command], None]


class Quorum:
    """n1 running behind a compromised gateway, n2 joined but away; three approvers, k = 2, held by n1."""

    def __init__(self, lab: InprocLab, t: Tamperer, keys: list[Approver]) -> None:
        self.lab, self.t, self.keys = lab, t, keys
        self.tamper: dict[str, Tamper] = {}  # batch id -> what the gateway does to its commands
        self.gpus = [g.uuid for g in lab.agents["n1"].inventory.gpus]
        t.outbound = self._outbound

    def _outbound(self, msg: GatewayMessage) -> GatewayMessage:
        if msg.HasField("command"):
            body = session_pb2.CommandBody.FromString(msg.command.envelope.body)
            change = self.tamper.get(body.batch_id)
            if change is not None:
                change(msg.command)
        return msg

    async def batch(self, gpu: str, tamper: Tamper | None = None) -> tuple[admin_pb2.BatchInfo, str]:
        """A gpu.reset batch on n1 and n2, approved by two approvers; returns it and n1's command id."""
        b = await self.lab.admin.create_batch("gpu.reset", ["n1", "n2"], json.dumps({"gpu_uuids": [gpu]}))
        if tamper is not None:
            self.tamper[b.id] = tamper  # before the approval: the command is sent the moment it is released
        b = await sign(self.lab, b, self.keys[0])
        b = await sign(self.lab, b, self.keys[1])
        assert b.state == "approved", b
        return b, next(leaf.command_id for leaf in b.leaves if leaf.node_id == "n1")

    def sent(self, batch_id: str) -> session_pb2.Command:
        """n1's command of a batch as the control plane wrote it (approval and proof included)."""
        for m in self.t.seen_out:
            if m.HasField("command"):
                body = session_pb2.CommandBody.FromString(m.command.envelope.body)
                if body.batch_id == batch_id and body.node_id == "n1":
                    return m.command
        raise AssertionError(f"no command of batch {batch_id} was sent")

    async def refused(self, command_id: str, reason: str, fragment: str) -> None:
        done = await settled(self.lab, command_id)
        assert (done["state"], done["reason"]) == ("rejected", reason), done
        info = await self.lab.admin.get_command(command_id)
        assert fragment in info.message, info.message

    def resets(self) -> dict[str, int]:
        return FakeHardware.read_resets(self.lab.node_dir("n1"))


async def start(lab: InprocLab) -> Quorum:
    t = compromise(lab)
    await lab.join("n1")
    await lab.join("n2")  # never started: its leaves stay pending, only n1's are sent
    await lab.start_node("n1")
    await lab.wait_connected("n1")
    keys = await approvers(lab)
    await lab.server.gateway.push_trust_if_changed()  # what the gateway's 1 s loop does, without the wait
    bundle = lab.agents["n1"].trust
    await until(lambda: len(bundle.bundle.approver_keys) == 3 and bundle.bundle.quorum_k == 2)
    return Quorum(lab, t, list(keys))


async def test_an_approval_or_proof_from_another_approved_batch_is_refused(lab: InprocLab) -> None:
    qr = await start(lab)
    other, other_cmd = await qr.batch(qr.gpus[1])
    assert (await settled(lab, other_cmd))["state"] == "succeeded"
    theirs = qr.sent(other.id)
    assert theirs.batch_approval and theirs.batch_proof

    def both(cmd: session_pb2.Command) -> None:
        cmd.batch_approval, cmd.batch_proof = theirs.batch_approval, theirs.batch_proof

    def approval_only(cmd: session_pb2.Command) -> None:
        cmd.batch_approval = theirs.batch_approval

    def proof_only(cmd: session_pb2.Command) -> None:
        cmd.batch_proof = theirs.batch_proof

    def relabelled(cmd: session_pb2.Command) -> None:
        """The other batch's signatures under this batch's id and scope: both are under every signature."""
        mine = common_pb2.BatchApproval.FromString(cmd.batch_approval)
        forged = common_pb2.BatchApproval.FromString(theirs.batch_approval)
        forged.batch_id, forged.scope_root, forged.leaf_count = mine.batch_id, mine.scope_root, mine.leaf_count
        cmd.batch_approval = forged.SerializeToString()

    cases: list[tuple[Tamper, str]] = [
        (both, "no approval for batch"),
        (approval_only, "no approval for batch"),
        (proof_only, "the proof does not put this command (node, kind, payload) in the approved scope"),
        (relabelled, "0 of 2 approvals hold"),
    ]
    for i, (tamper, fragment) in enumerate(cases):
        b, cid = await qr.batch(qr.gpus[2 + i], tamper)
        await qr.refused(cid, "BATCH_UNAPPROVED", fragment)
        if "batch" in fragment:
            assert b.id in (await lab.admin.get_command(cid)).message
    assert qr.resets() == {qr.gpus[1]: 1}  # only the honest batch ran


async def test_a_tampered_payload_with_the_original_proof_is_refused(lab: InprocLab) -> None:
    qr = await start(lab)
    target = qr.gpus[5]

    def retarget(cmd: session_pb2.Command) -> None:
        msg = GatewayMessage(command=cmd)
        rewrite_command_body(msg, lambda body: body.payload.Pack(reset_request(target)))
        cmd.CopyFrom(msg.command)

    _, cid = await qr.batch(qr.gpus[0], retarget)
    await qr.refused(cid, "BAD_SIGNATURE", "does not match")
    sec = await security_event(lab, "security.bad-signature", "n1")
    assert sec["command_id"] == cid
    assert qr.resets() == {}


async def test_a_stripped_or_thinned_approval_is_refused(lab: InprocLab) -> None:
    qr = await start(lab)

    def strip_approval(cmd: session_pb2.Command) -> None:
        cmd.ClearField("batch_approval")

    def strip_proof(cmd: session_pb2.Command) -> None:
        cmd.ClearField("batch_proof")

    def drop_one(cmd: session_pb2.Command) -> None:
        a = common_pb2.BatchApproval.FromString(cmd.batch_approval)
        del a.signatures[1]
        cmd.batch_approval = a.SerializeToString()

    def doubled(cmd: session_pb2.Command) -> None:
        """One approver's signature twice in place of two approvers."""
        a = common_pb2.BatchApproval.FromString(cmd.batch_approval)
        a.signatures[1].CopyFrom(a.signatures[0])
        cmd.batch_approval = a.SerializeToString()

    cases: list[tuple[Tamper, str]] = [
        (strip_approval, "no approval for batch"),
        (strip_proof, "in the approved scope"),
        (drop_one, "1 of 2 approvals hold"),
        (doubled, "signed twice"),
    ]
    for i, (tamper, fragment) in enumerate(cases):
        _, cid = await qr.batch(qr.gpus[i], tamper)
        await qr.refused(cid, "BATCH_UNAPPROVED", fragment)
    assert qr.resets() == {}


async def test_a_leaf_that_ran_is_never_run_again_by_a_replay(lab: InprocLab) -> None:
    qr = await start(lab)
    b, cid = await qr.batch(qr.gpus[0])
    assert (await settled(lab, cid))["state"] == "succeeded"
    original = qr.sent(b.id)
    assert qr.t.current is not None
    node = qr.t.current.inner  # the real link to the node: the gateway writes whatever it likes

    # The same frame again: answered from the node's journal, the reset is not repeated.
    updates: list[session_pb2.CommandUpdate] = []

    def record(m: session_pb2.NodeMessage) -> session_pb2.NodeMessage:
        if m.HasField("command_update"):
            updates.append(m.command_update)
        return m

    qr.t.inbound = record
    await node.send(GatewayMessage(command=original))
    await until(lambda: any(u.command_id == cid and u.state == session_pb2.COMMAND_SUCCEEDED for u in updates))

    # The same leaf under a new command id: the body is signed, so only a worker key could make one.
    fresh = GatewayMessage(command=original)
    rewrite_command_body(fresh, lambda body: setattr(body, "id", "01FAKEREPLAY0000000000000"))
    await node.send(fresh)
    journal = lab.agents["n1"].journal

    async def refused() -> bool:
        entry = await journal.get_command("01FAKEREPLAY0000000000000")
        if entry is None or entry.state != "done" or entry.result is None:
            return False
        update = session_pb2.CommandUpdate.FromString(entry.result)
        return update.state == session_pb2.COMMAND_REJECTED and update.reason == "BAD_SIGNATURE"

    await until(refused)
    assert qr.resets() == {qr.gpus[0]: 1}


async def test_an_honest_gateway_runs_a_second_approved_batch_with_the_same_scope(lab: InprocLab) -> None:
    """The control for the swaps above: two approved batches, relayed honestly, both run.

    Bug: the node claims a leaf by scope root + leaf hash, and two batches of the
    same kind, nodes and payload have the same root; the second batch, approved by
    its own quorum, is refused "BATCH_UNAPPROVED: this leaf of batch … already ran as
    command …" (see tests/unit/agent/test_quorum_check.py, the same-scope test).
    """
    qr = await start(lab)
    first, first_cmd = await qr.batch(qr.gpus[0])
    assert (await settled(lab, first_cmd))["state"] == "succeeded"
    second, second_cmd = await qr.batch(qr.gpus[0])
    assert second.scope_root == first.scope_root and second.id != first.id
    done = await settled(lab, second_cmd)
    info = await lab.admin.get_command(second_cmd)
    assert done["state"] == "succeeded", (done, info.message)
    assert qr.resets() == {qr.gpus[0]: 2}
