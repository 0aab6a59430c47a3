"""Which quorum settings a node takes (agent.trust.quorum_path, decide_bundle): the root's signature AND a path
of changes each approved by change_threshold of the approvers held at that step — every branch, and the rule
as a property over random chains of changes."""

from __future__ import annotations

import random
from dataclasses import dataclass

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.trust import decide_bundle, quorum_changed, quorum_path
from bc.pki import quorum as q
from bc.pki.ca import CertificateAuthority
from bc.pki.secrets_source import SystemSecrets
from bc.pki.signing import PURPOSE_TRUST_BUNDLE, WorkerSigner, create_root, issue_worker
from bc.protocol.pb import common_pb2
from bc.testing import virtual_clock

RNG = random.Random(1)  # ids and serials, as the one seeded Random of a process would give them
SECRETS = SystemSecrets()

NOW = 1_800_000_000.0
CLOCK = virtual_clock(NOW)
CA_PEM = CertificateAuthority.create(CLOCK, RNG, SECRETS).ca_pem
ROOT_KEY, ROOT = create_root(CLOCK, RNG, SECRETS)
ROOT_PEM = ROOT.public_bytes(serialization.Encoding.PEM)
ROOT_SIGNER = WorkerSigner(ROOT_KEY, ROOT)
WORKER = WorkerSigner(*issue_worker(ROOT_KEY, ROOT, CLOCK, RNG, SECRETS))
KEYS = [ed25519.Ed25519PrivateKey.generate() for _ in range(5)]
NAMES = ["alice", "bob", "carol", "dave", "erin"]


def raw(key: ed25519.Ed25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def approver(i: int) -> common_pb2.ApproverKey:
    return common_pb2.ApproverKey(
        key_id=q.key_id(raw(KEYS[i])), public_key=raw(KEYS[i]), name=NAMES[i], operator=NAMES[i]
    )


def quorum(members: list[int], k: int, version: int, allowance: int = 0) -> common_pb2.QuorumSettings:
    s = common_pb2.QuorumSettings(version=version)
    if members:
        s.approver_keys.extend(approver(i) for i in members)
        s.quorum_k, s.unbatched_destructive_per_hour = k, allowance
    return s


def change(
    frm: common_pb2.QuorumSettings, to: common_pb2.QuorumSettings, signers: list[int], requested_by: str = "ops"
) -> common_pb2.QuorumChange:
    c = common_pb2.QuorumChange(
        change_id=f"q-{frm.version}-{to.version}",
        requested_by=requested_by,
        from_digest=q.settings_digest(frm),
        settings=to,
    )
    msg = q.change_message(c.change_id, c.from_digest, q.settings_digest(to), requested_by)
    for i in signers:
        c.signatures.add(key_id=q.key_id(raw(KEYS[i])), signature=KEYS[i].sign(msg))
    return c


def bundle(s: common_pb2.QuorumSettings, *changes: common_pb2.QuorumChange) -> common_pb2.TrustBundle:
    b = common_pb2.TrustBundle(ca_pem=CA_PEM, command_signing_roots=[ROOT_PEM], quorum_version=s.version)
    b.approver_keys.extend(s.approver_keys)
    b.quorum_k, b.unbatched_destructive_per_hour = s.quorum_k, s.unbatched_destructive_per_hour
    b.quorum_changes.extend(changes)
    return b


def offer(
    held: common_pb2.TrustBundle, offered: common_pb2.TrustBundle, signer: WorkerSigner = ROOT_SIGNER
) -> common_pb2.TrustBundle | None:
    env = signer.envelope(PURPOSE_TRUST_BUNDLE, offered.SerializeToString(deterministic=True))
    return decide_bundle(held, env, offered, CA_PEM, NOW).bundle


S0 = quorum([], 0, 0)
S1 = quorum([0, 1, 2], 2, 1)
S2 = quorum([0, 1, 2], 3, 2)
S3 = quorum([0, 1, 2, 3], 3, 3)


# -- quorum_path, branch by branch -----------------------------------------------------------------------


def test_the_same_settings_need_no_path() -> None:
    assert quorum_path(bundle(S1), bundle(S1)) is None
    assert not quorum_changed(bundle(S1), bundle(S1, change(S0, S1, [])))  # the changes carried do not matter


def test_with_no_approvers_held_the_first_change_needs_no_approval() -> None:
    assert quorum_path(bundle(S0), bundle(S1, change(S0, S1, []))) is None


def test_k_approvals_of_the_held_approvers_carry_a_change() -> None:
    assert quorum_path(bundle(S1), bundle(S2, change(S1, S2, [0, 2]))) is None


def test_fewer_than_k_approvals_are_refused_saying_why() -> None:
    why = quorum_path(bundle(S1), bundle(S2, change(S1, S2, [0])))
    assert why == "quorum change q-1-2 holds 1 of the 2 approvals it needs from the approvers this node holds"
    why = quorum_path(bundle(S1), bundle(S2, change(S1, S2, [0, 0])))
    assert why is not None and "holds 1 of the 2" in why and "signed twice" in why


def test_approvals_by_keys_the_node_does_not_hold_do_not_count() -> None:
    why = quorum_path(bundle(S1), bundle(S2, change(S1, S2, [3, 4])))
    assert why is not None and "holds 0 of the 2" in why and "not an approver key" in why


def test_the_requesters_own_key_does_not_count_for_their_change() -> None:
    why = quorum_path(bundle(S1), bundle(S2, change(S1, S2, [0, 1], requested_by="alice")))
    assert why is not None and "holds 1 of the 2" in why and "the requester's own key" in why


def test_a_key_registered_to_the_requester_does_not_count_whatever_its_name() -> None:
    held = quorum([0, 1, 2], 2, 1)
    held.approver_keys[1].name = "b0b"  # bob's key under another name, still registered to operator bob
    to = quorum([0, 1, 2], 3, 2)
    why = quorum_path(bundle(held), bundle(to, change(held, to, [0, 1], requested_by="bob")))
    assert why is not None and "the requester's own key" in why


def test_two_keys_of_one_operator_count_once() -> None:
    held = quorum([0, 1, 2], 2, 1)
    held.approver_keys[1].operator = "alice"
    to = quorum([0, 1, 2], 3, 2)
    why = quorum_path(bundle(held), bundle(to, change(held, to, [0, 1])))
    assert why is not None and "operator alice already approved" in why
    assert quorum_path(bundle(held), bundle(to, change(held, to, [0, 2]))) is None


def test_a_change_must_move_the_version_forward() -> None:
    back = quorum([0, 1], 1, 1)  # a new value under an old version number
    why = quorum_path(bundle(S1), bundle(back, change(S1, back, [0, 1])))
    assert why == "quorum change q-1-1 does not move the settings' version forward"


def test_changes_the_node_already_passed_are_skipped_and_the_rest_walked() -> None:
    chain = [change(S0, S1, []), change(S1, S2, [0, 1]), change(S2, S3, [0, 1, 2])]
    for held in (S0, S1, S2, S3):
        assert quorum_path(bundle(held), bundle(S3, *chain)) is None


def test_a_gap_in_the_path_is_refused() -> None:
    why = quorum_path(bundle(S1), bundle(S3, change(S2, S3, [0, 1, 2])))
    assert why == "no approved quorum change leads from the quorum settings this node holds to the offered ones"


def test_a_path_that_ends_elsewhere_than_the_offered_settings_is_refused() -> None:
    other = quorum([3], 1, 2)
    why = quorum_path(bundle(S1), bundle(other, change(S1, S2, [0, 1])))
    assert why is not None and why.startswith("no approved quorum change leads")


def test_an_old_approved_change_cannot_roll_the_settings_back() -> None:
    """S1 -> S2 -> S1' (S1's content again, a new version); replaying S1 -> S2 is not a path from S1'."""
    s1_again = quorum([0, 1, 2], 2, 3)
    chain = [change(S1, S2, [0, 1]), change(S2, s1_again, [0, 1, 2])]
    assert quorum_path(bundle(S1), bundle(s1_again, *chain)) is None
    why = quorum_path(bundle(s1_again), bundle(S2, chain[0]))
    assert why is not None and why.startswith("no approved quorum change leads")


def test_fewer_approvers_than_k_need_all_of_them() -> None:
    lonely = quorum([0], 2, 1)  # one approver, k = 2: the one approver alone changes the set
    to = quorum([0, 1], 2, 2)
    assert quorum_path(bundle(lonely), bundle(to, change(lonely, to, [0]))) is None
    assert "holds 0 of the 1" in str(quorum_path(bundle(lonely), bundle(to, change(lonely, to, []))))


# -- decide_bundle: the root AND the approvals -----------------------------------------------------------


def test_the_root_with_the_approvals_is_taken() -> None:
    offered = bundle(S2, change(S1, S2, [1, 2]))
    assert offer(bundle(S1), offered) == offered


def test_the_root_without_the_approvals_is_refused() -> None:
    assert offer(bundle(S1), bundle(S2)) is None
    assert offer(bundle(S1), bundle(S2, change(S1, S2, [1]))) is None


def test_the_approvals_without_the_root_are_refused() -> None:
    offered = bundle(S2, change(S1, S2, [1, 2]))
    d = decide_bundle(
        bundle(S1), WORKER.envelope(PURPOSE_TRUST_BUNDLE, offered.SerializeToString()), offered, CA_PEM, NOW
    )
    assert d.bundle is None and "root's own signature" in d.reason


def test_a_worker_signed_bundle_that_keeps_the_quorum_is_taken() -> None:
    """With the root key offline the worker signs: fine, as long as the quorum settings stay."""
    offered = bundle(S1, change(S0, S1, []))
    offered.ca_pem = CA_PEM + b"\n"  # another byte of the bundle changes: it is still adopted
    d = decide_bundle(
        bundle(S1), WORKER.envelope(PURPOSE_TRUST_BUNDLE, offered.SerializeToString()), offered, CA_PEM, NOW
    )
    assert d.bundle == offered


def test_an_unsigned_bundle_needs_the_approvals_too_while_no_roots_are_held() -> None:
    """Signing off: no root, but a held approver set still changes only with its approvals."""

    def plain(s: common_pb2.QuorumSettings, *changes: common_pb2.QuorumChange) -> common_pb2.TrustBundle:
        b = bundle(s, *changes)
        b.ClearField("command_signing_roots")
        return b

    d = decide_bundle(plain(S1), None, plain(S2), CA_PEM, NOW)
    assert d.bundle is None and d.reason.startswith("no approved quorum change leads")
    offered = plain(S2, change(S1, S2, [0, 1]))
    assert decide_bundle(plain(S1), None, offered, CA_PEM, NOW).bundle == offered


# -- the rule as a property --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    members: list[int]
    k: int
    signers: list[int]


steps = st.builds(
    Step,
    members=st.lists(st.integers(0, 4), min_size=0, max_size=5, unique=True),
    k=st.integers(1, 5),
    signers=st.lists(st.integers(0, 4), max_size=5),
)


@settings(max_examples=60, deadline=None)
@given(st.lists(steps, min_size=1, max_size=5), st.data())
def test_a_node_takes_the_offered_settings_exactly_when_every_step_it_walks_is_approved(
    chain_steps: list[Step], data: st.DataObject
) -> None:
    states = [S0]
    changes = []
    approved = []
    for i, step in enumerate(chain_steps):
        frm, to = states[-1], quorum(step.members, step.k, i + 1)
        held_keys = {q.key_id(raw(KEYS[j])) for j in step.signers} & {a.key_id for a in frm.approver_keys}
        approved.append(len(held_keys) >= q.change_threshold(frm))
        changes.append(change(frm, to, step.signers))
        states.append(to)
    held_at = data.draw(st.integers(0, len(states) - 1), label="the node holds")
    expected = all(approved[held_at:])
    why = quorum_path(bundle(states[held_at]), bundle(states[-1], *changes))
    assert (why is None) == expected, why
    taken = offer(bundle(states[held_at]), bundle(states[-1], *changes))
    assert (taken is not None or held_at == len(states) - 1) == expected
