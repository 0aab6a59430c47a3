"""Quorum changes on real nodes: new settings reach a node only with the root's signature AND the approvals of
the approvers it holds, as TUF rotates its root.

The forger here holds the signing root's own key (the server's, as a single
admin with the root key online would) and a compromised gateway (the tamperer
of test_compromised_gateway) that writes any frame to the node. Every bundle
that moves the quorum without `change_threshold` valid approvals of the
node's current approvers is refused, and the node keeps what it holds; the
same bundle with the approvals is taken. Honest changes reach the nodes only
once approved, and a node that was away walks the changes it missed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
from cryptography.hazmat.primitives.asymmetric import ed25519

from bc.errors import UsageError
from bc.pki import quorum as q
from bc.pki.signing import PURPOSE_TRUST_BUNDLE
from bc.protocol.pb import common_pb2
from bc.protocol.pb.session_pb2 import GatewayMessage
from tests.integration.conftest import InprocLab
from tests.integration.operators_lab import Approver, add_operator, approvers, as_operator, b64, raw, sign_change
from tests.integration.test_compromised_gateway import Tamperer, compromise, until


class Refusals(logging.Handler):
    """The agent's `trust.bundle-refused` log lines, each waking the test."""

    def __init__(self) -> None:
        super().__init__()
        self.reasons: list[str] = []
        self.changed = asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if text.startswith("event=trust.bundle-refused"):
            self.reasons.append(text.removeprefix("event=trust.bundle-refused reason="))
            self.changed.set()

    async def next(self, after: int, timeout: float = 10.0) -> str:
        """The first refusal after the first `after` ones (count them before sending: the agent may refuse
        a frame before the gateway's write of it returns)."""
        seen = after
        async with asyncio.timeout(timeout):
            while len(self.reasons) == seen:
                self.changed.clear()
                await self.changed.wait()
        return self.reasons[seen]


@contextmanager
def refusals() -> Iterator[Refusals]:
    h = Refusals()
    logger = logging.getLogger("agent")
    logger.addHandler(h)
    try:
        yield h
    finally:
        logger.removeHandler(h)


async def running(lab: InprocLab) -> tuple[Tamperer, list[Approver]]:
    """n1 behind a compromised gateway, holding three approvers with k = 2 (quorum settings version 3)."""
    t = compromise(lab)
    await lab.join("n1")
    await lab.start_node("n1")
    await lab.wait_connected("n1")
    signers = await approvers(lab)
    await lab.server.gateway.push_trust_if_changed()  # what the gateway's 1 s loop does, without the wait
    held = lab.agents["n1"].trust
    await until(lambda: len(held.bundle.approver_keys) == 3 and held.bundle.quorum_version == 3)
    return t, signers


def mallory_settings(held: common_pb2.TrustBundle, key: ed25519.Ed25519PrivateKey) -> common_pb2.QuorumSettings:
    """What the forger wants: their own key as the only approver, k = 1."""
    kid = q.key_id(raw(key))
    return common_pb2.QuorumSettings(
        version=held.quorum_version + 1,
        approver_keys=[common_pb2.ApproverKey(key_id=kid, public_key=raw(key), name="mallory", operator="mallory")],
        quorum_k=1,
    )


def change_of(
    held: common_pb2.TrustBundle, to: common_pb2.QuorumSettings, change_id: str = "q-forged"
) -> common_pb2.QuorumChange:
    return common_pb2.QuorumChange(
        change_id=change_id, requested_by="mallory", from_digest=q.settings_digest(q.settings_of(held)), settings=to
    )


def approve(change: common_pb2.QuorumChange, *keys: ed25519.Ed25519PrivateKey) -> common_pb2.QuorumChange:
    msg = q.change_message(
        change.change_id, change.from_digest, q.settings_digest(change.settings), change.requested_by
    )
    for key in keys:
        change.signatures.add(key_id=q.key_id(raw(key)), signature=key.sign(msg))
    return change


def bundle_with(
    held: common_pb2.TrustBundle, to: common_pb2.QuorumSettings, *changes: common_pb2.QuorumChange
) -> bytes:
    b = common_pb2.TrustBundle()
    b.CopyFrom(held)
    del b.approver_keys[:]
    b.approver_keys.extend(to.approver_keys)
    b.quorum_k, b.unbatched_destructive_per_hour, b.quorum_version = (
        to.quorum_k,
        to.unbatched_destructive_per_hour,
        to.version,
    )
    del b.quorum_changes[:]
    b.quorum_changes.extend(changes)
    return b.SerializeToString(deterministic=True)


async def test_a_root_signed_bundle_without_k_current_approvals_is_refused(lab: InprocLab) -> None:
    t, signers = await running(lab)
    agent = lab.agents["n1"]
    held = common_pb2.TrustBundle()
    held.CopyFrom(agent.trust.bundle)
    assert lab.server.signer.keys is not None
    root = lab.server.signer.keys.root_signer()
    assert root is not None, "the lab's bc serve holds its root key"
    mallory = ed25519.Ed25519PrivateKey.generate()
    to = mallory_settings(held, mallory)
    first, second = signers[0].key, signers[1].key
    stale = common_pb2.QuorumChange()
    stale.CopyFrom(agent.trust.bundle.quorum_changes[0])  # a real, approved change: from version 0 to 1

    forgeries: list[tuple[str, Callable[[], bytes], str]] = [
        ("the root alone", lambda: bundle_with(held, to), "no approved quorum change leads"),
        ("one approval of two", lambda: bundle_with(held, to, approve(change_of(held, to), first)), "holds 1 of the 2"),
        (
            "one approver twice",
            lambda: bundle_with(held, to, approve(change_of(held, to), first, first)),
            "signed twice",
        ),
        (
            "the forger's own key",
            lambda: bundle_with(held, to, approve(change_of(held, to), mallory, first)),
            "not an approver key",
        ),
        (
            "approvals over other settings",
            lambda: bundle_with(held, to, _resettled(approve(change_of(held, to), first, second), held)),
            "holds 0 of the 2",
        ),
        ("an old approved change replayed", lambda: bundle_with(held, to, stale), "no approved quorum change leads"),
    ]
    assert t.current is not None
    node = t.current.inner  # the real link to the node: the gateway writes whatever it likes
    with refusals() as seen:
        for what, body, fragment in forgeries:
            env = root.envelope(PURPOSE_TRUST_BUNDLE, body())
            before = len(seen.reasons)
            await node.send(GatewayMessage(trust=env))
            reason = await seen.next(before)
            assert fragment in reason, (what, reason)
            assert agent.trust.bundle == held, what

        # The control: the same change with two approvals of the approvers the node holds is taken.
        approved = bundle_with(held, to, approve(change_of(held, to), first, second))
        await node.send(GatewayMessage(trust=root.envelope(PURPOSE_TRUST_BUNDLE, approved)))
        await until(lambda: agent.trust.bundle.quorum_version == to.version)
    assert [a.name for a in agent.trust.bundle.approver_keys] == ["mallory"] and agent.trust.bundle.quorum_k == 1


def _resettled(change: common_pb2.QuorumChange, held: common_pb2.TrustBundle) -> common_pb2.QuorumChange:
    """Real approvals, re-labelled onto other target settings (k = 2 kept, the forger's key added)."""
    change.settings.quorum_k = 2
    change.settings.approver_keys.extend(held.approver_keys)
    return change


async def test_a_threshold_change_reaches_the_nodes_only_at_k_approvals(lab: InprocLab) -> None:
    _, signers = await running(lab)
    agent = lab.agents["n1"]
    s = await lab.admin.set_approver_threshold(3)
    assert (s.threshold, s.change.state, s.change.threshold) == (2, "pending", 2)
    await lab.server.gateway.push_trust_if_changed()  # nothing to push: the store still says k = 2
    assert agent.trust.bundle.quorum_k == 2

    c = await sign_change(lab, s.change.id, signers[:1])
    assert (c.state, c.approvals) == ("pending", 1)
    assert (await lab.admin.list_approvers()).threshold == 2
    await lab.server.gateway.push_trust_if_changed()
    assert agent.trust.bundle.quorum_k == 2

    c = await sign_change(lab, s.change.id, signers[1:2])
    assert c.state == "applied"
    assert (await lab.admin.list_approvers()).threshold == 3
    await lab.server.gateway.push_trust_if_changed()
    await until(lambda: agent.trust.bundle.quorum_k == 3)
    last = agent.trust.bundle.quorum_changes[-1]
    assert last.change_id == s.change.id and len(last.signatures) == 2
    ev = await lab.wait_event("quorum.changed", lambda ev, d: ev.subject == s.change.id)
    assert ev.subject == s.change.id


async def test_a_node_that_was_away_walks_the_changes_it_missed(lab: InprocLab) -> None:
    _, signers = await running(lab)
    await lab.stop_node("n1")
    s = await lab.admin.set_approver_threshold(3)
    assert (await sign_change(lab, s.change.id, signers)).state == "applied"
    s = await lab.admin.set_unbatched_allowance(2)
    assert (await sign_change(lab, s.change.id, signers)).state == "applied"  # now needs all three
    agent = await lab.start_node("n1")
    await lab.wait_connected("n1", after_seq=0)
    await until(lambda: agent.trust.bundle.quorum_version == 5)
    assert (agent.trust.bundle.quorum_k, agent.trust.bundle.unbatched_destructive_per_hour) == (3, 2)


async def test_the_requester_cannot_approve_a_change_they_asked_for(lab: InprocLab) -> None:
    _, signers = await running(lab)
    boss_cfg = await add_operator(lab, "boss", role="admin")
    boss = Approver("boss", ed25519.Ed25519PrivateKey.generate(), boss_cfg)
    s = await lab.admin.add_approver("boss", b64(boss.key))
    assert (await sign_change(lab, s.change.id, signers)).state == "applied"
    # boss, an admin and an approver, asks for a change: their own approval does not count, sent as themselves.
    s = await as_operator(boss_cfg, lambda c: c.set_approver_threshold(1))
    assert s.change.state == "pending" and s.change.requested_by == "boss"
    with pytest.raises(UsageError, match=f"boss asked for quorum change {s.change.id}"):
        await sign_change(lab, s.change.id, [boss])
    c = await sign_change(lab, s.change.id, signers[:2])
    assert c.state == "applied" and {d.name for d in c.decisions} == {"approver0", "approver1"}
