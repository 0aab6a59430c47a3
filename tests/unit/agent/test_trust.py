"""What the node trusts: which trust bundle it holds after a Welcome, and which commands and specs need a signature."""

from __future__ import annotations

import random

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
from hypothesis import given
from hypothesis import strategies as st

from agent.trust import AgentTrust, BundleDecision, decide_bundle
from bc.pki.ca import CertificateAuthority
from bc.pki.secrets_source import SystemSecrets
from bc.pki.signing import (
    PURPOSE_COMMAND,
    PURPOSE_DESIRED_STATE,
    PURPOSE_TRUST_BUNDLE,
    WORKER_LIFETIME_S,
    WorkerSigner,
    create_root,
    issue_worker,
)
from bc.protocol import kinds
from bc.protocol.pb import common_pb2, session_pb2
from bc.testing import virtual_clock

RNG = random.Random(1)  # ids and serials, as the one seeded Random of a process would give them
SECRETS = SystemSecrets()

NOW = 1_800_000_000.0
CLOCK = virtual_clock(NOW)
CA_PEM = CertificateAuthority.create(CLOCK, RNG, SECRETS).ca_pem
OTHER_CA_PEM = CertificateAuthority.create(CLOCK, RNG, SECRETS).ca_pem
ROOT_KEY_A, ROOT_A = create_root(CLOCK, RNG, SECRETS)
ROOT_KEY_B, ROOT_B = create_root(CLOCK, RNG, SECRETS)
WORKER_A = WorkerSigner(*issue_worker(ROOT_KEY_A, ROOT_A, CLOCK, RNG, SECRETS))
WORKER_A2 = WorkerSigner(*issue_worker(ROOT_KEY_A, ROOT_A, CLOCK, RNG, SECRETS, name="rotated"))
WORKER_B = WorkerSigner(*issue_worker(ROOT_KEY_B, ROOT_B, CLOCK, RNG, SECRETS))
ROOT_SIGNER_A = WorkerSigner(ROOT_KEY_A, ROOT_A)  # the root's own key, which alone may change the quorum


def pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


ROOT_A_PEM, ROOT_B_PEM = pem(ROOT_A), pem(ROOT_B)


def bundle(*roots: bytes, ca: bytes = CA_PEM, quorum_k: int = 0) -> common_pb2.TrustBundle:
    return common_pb2.TrustBundle(ca_pem=ca, command_signing_roots=list(roots), quorum_k=quorum_k)


def signed(worker: WorkerSigner, b: common_pb2.TrustBundle, purpose: str = PURPOSE_TRUST_BUNDLE) -> common_pb2.Envelope:
    return worker.envelope(purpose, b.SerializeToString(deterministic=True))


NONE = common_pb2.TrustBundle()
HOLDING_A = bundle(ROOT_A_PEM)


# -- decide_bundle: holding roots ----------------------------------------------------------------


def test_a_bundle_signed_by_a_worker_of_a_held_root_is_adopted() -> None:
    offered = bundle(ROOT_A_PEM, ROOT_B_PEM)
    d = decide_bundle(HOLDING_A, signed(WORKER_A, offered), offered, CA_PEM, NOW)
    assert d.bundle == offered and d.reason == "signed by a held root"


def test_the_signed_body_wins_over_the_plain_copy_beside_it() -> None:
    """The plain `trust` field is the gateway's to change; only the signed body is believed."""
    offered = bundle(ROOT_A_PEM, quorum_k=2)
    d = decide_bundle(HOLDING_A, signed(ROOT_SIGNER_A, offered), bundle(ROOT_B_PEM), CA_PEM, NOW)
    assert d.bundle == offered


def test_a_rotated_worker_of_the_held_root_may_sign_the_bundle() -> None:
    offered = bundle(ROOT_A_PEM, ROOT_B_PEM)
    d = decide_bundle(HOLDING_A, signed(WORKER_A2, offered), offered, CA_PEM, NOW)
    assert d.bundle == offered


def test_a_held_root_may_hand_over_to_a_new_root() -> None:
    offered = bundle(ROOT_B_PEM)
    d = decide_bundle(HOLDING_A, signed(WORKER_A, offered), offered, CA_PEM, NOW)
    assert d.bundle == offered


@pytest.mark.parametrize("offered", [bundle(ROOT_B_PEM), bundle(ROOT_A_PEM, ROOT_B_PEM)])
def test_a_bundle_signed_by_an_unknown_root_is_refused_while_holding_roots(offered: common_pb2.TrustBundle) -> None:
    """Even when it lists the held root too: a gateway cannot add its own root."""
    d = decide_bundle(HOLDING_A, signed(WORKER_B, offered), offered, CA_PEM, NOW)
    assert d.bundle is None
    assert "signature does not hold" in d.reason and "does not chain" in d.reason


@pytest.mark.parametrize(
    "plain",
    [NONE, bundle(), bundle(ROOT_B_PEM), bundle(ROOT_A_PEM, quorum_k=3), bundle(ROOT_A_PEM)],
    ids=["nothing", "roots-stripped", "root-swapped", "quorum-changed", "same-as-held"],
)
def test_an_unsigned_bundle_never_replaces_one_holding_roots(plain: common_pb2.TrustBundle) -> None:
    """A gateway can neither strip the roots (to slip in unsigned intent) nor swap them."""
    d = decide_bundle(HOLDING_A, None, plain, CA_PEM, NOW)
    assert d.bundle is None
    if plain.ByteSize():
        assert d.reason == "an unsigned trust bundle cannot replace one that holds command-signing roots"
    else:
        assert d.reason == "no bundle offered"


def test_an_envelope_without_a_body_counts_as_unsigned() -> None:
    env = common_pb2.Envelope(purpose=PURPOSE_TRUST_BUNDLE, signature=b"x" * 64, key_id=WORKER_A.key_id)
    d = decide_bundle(HOLDING_A, env, bundle(), CA_PEM, NOW)
    assert d.bundle is None and "unsigned trust bundle cannot replace" in d.reason


def test_an_envelope_with_a_body_and_no_signature_is_refused() -> None:
    offered = bundle()
    env = signed(WORKER_A, offered)
    env.signature = b""
    d = decide_bundle(HOLDING_A, env, offered, CA_PEM, NOW)
    assert d.bundle is None and "unsigned" in d.reason


def test_a_tampered_signed_bundle_is_refused() -> None:
    env = signed(WORKER_A, bundle(ROOT_A_PEM))
    env.body = bundle(ROOT_A_PEM, ROOT_B_PEM).SerializeToString(deterministic=True)
    d = decide_bundle(HOLDING_A, env, None, CA_PEM, NOW)
    assert d.bundle is None and "does not match the body" in d.reason


def test_a_bundle_signed_for_another_purpose_is_refused() -> None:
    offered = bundle(ROOT_A_PEM, ROOT_B_PEM)
    for purpose in (PURPOSE_COMMAND, PURPOSE_DESIRED_STATE):
        d = decide_bundle(HOLDING_A, signed(WORKER_A, offered, purpose), offered, CA_PEM, NOW)
        assert d.bundle is None and "purpose" in d.reason


def test_a_bundle_signed_by_an_expired_worker_is_refused() -> None:
    offered = bundle(ROOT_A_PEM, quorum_k=1)
    d = decide_bundle(HOLDING_A, signed(WORKER_A, offered), offered, CA_PEM, NOW + WORKER_LIFETIME_S + 60)
    assert d.bundle is None and "not valid at this time" in d.reason


def test_a_bundle_that_does_not_decode_is_refused() -> None:
    env = WORKER_A.envelope(PURPOSE_TRUST_BUNDLE, b"\xff\xff\xff")
    d = decide_bundle(HOLDING_A, env, None, CA_PEM, NOW)
    assert d == BundleDecision(None, "the signed trust bundle does not decode")


def test_a_signed_bundle_naming_another_ca_is_refused() -> None:
    offered = bundle(ROOT_A_PEM, ca=OTHER_CA_PEM)
    d = decide_bundle(HOLDING_A, signed(WORKER_A, offered), offered, CA_PEM, NOW)
    assert d.bundle is None and d.reason == "the trust bundle names another CA than the one pinned at join"
    # The same check applies before any root is held.
    d = decide_bundle(NONE, signed(WORKER_A, offered), offered, CA_PEM, NOW)
    assert d.bundle is None and "another CA" in d.reason


def test_the_ca_comparison_ignores_surrounding_whitespace() -> None:
    offered = bundle(ROOT_A_PEM, ca=b"\n" + CA_PEM.strip() + b"\n\n", quorum_k=1)
    d = decide_bundle(HOLDING_A, signed(ROOT_SIGNER_A, offered), offered, CA_PEM.strip(), NOW)
    assert d.bundle == offered


def test_an_unchanged_signed_bundle_changes_nothing() -> None:
    d = decide_bundle(HOLDING_A, signed(WORKER_A, HOLDING_A), HOLDING_A, CA_PEM, NOW)
    assert d.bundle is None and d.reason == "unchanged"


def test_nothing_offered_keeps_the_held_bundle() -> None:
    for current in (HOLDING_A, NONE):
        assert decide_bundle(current, None, None, CA_PEM, NOW).reason == "no bundle offered"
        assert decide_bundle(current, None, None, CA_PEM, NOW).bundle is None
        assert decide_bundle(current, common_pb2.Envelope(), NONE, CA_PEM, NOW).bundle is None


@given(
    roots=st.lists(st.sampled_from([ROOT_A_PEM, ROOT_B_PEM, b"", b"junk"]), max_size=3),
    ca=st.sampled_from([b"", CA_PEM, OTHER_CA_PEM]),
    quorum=st.integers(0, 5),
)
def test_holding_roots_no_unsigned_bundle_is_ever_adopted(roots: list[bytes], ca: bytes, quorum: int) -> None:
    plain = bundle(*roots, ca=ca, quorum_k=quorum)
    assert decide_bundle(HOLDING_A, None, plain, CA_PEM, NOW).bundle is None
    # Nor one signed by the other root's worker.
    assert decide_bundle(HOLDING_A, signed(WORKER_B, plain), plain, CA_PEM, NOW).bundle is None


# -- decide_bundle: no roots held yet ------------------------------------------------------------


def test_an_unsigned_bundle_never_brings_roots() -> None:
    offered = bundle(ROOT_A_PEM)
    d = decide_bundle(NONE, None, offered, CA_PEM, NOW)
    assert d.bundle is None and d.reason == "an unsigned trust bundle cannot bring command-signing roots"


def test_with_no_roots_held_an_unsigned_bundle_without_roots_is_adopted() -> None:
    d = decide_bundle(bundle(ca=CA_PEM), None, bundle(ca=CA_PEM, quorum_k=1), CA_PEM, NOW)
    assert d.bundle == bundle(ca=CA_PEM, quorum_k=1)


def test_with_no_roots_held_an_unchanged_unsigned_bundle_changes_nothing() -> None:
    held = bundle(ca=CA_PEM)
    d = decide_bundle(held, None, bundle(ca=CA_PEM), CA_PEM, NOW)
    assert d.bundle is None and d.reason == "unchanged"


def test_with_no_roots_held_a_bundle_signed_by_one_of_its_own_roots_is_adopted() -> None:
    offered = bundle(ROOT_A_PEM)
    d = decide_bundle(NONE, signed(WORKER_A, offered), offered, CA_PEM, NOW)
    assert d.bundle == offered and d.reason == "first signed bundle"


def test_with_no_roots_held_a_bundle_signed_by_a_root_it_does_not_carry_is_refused() -> None:
    offered = bundle(ROOT_A_PEM)
    d = decide_bundle(NONE, signed(WORKER_B, offered), offered, CA_PEM, NOW)
    assert d.bundle is None and "does not chain" in d.reason


def test_once_adopted_the_roots_guard_the_next_bundle() -> None:
    first = bundle(ROOT_A_PEM)
    held = decide_bundle(NONE, signed(WORKER_A, first), first, CA_PEM, NOW).bundle
    assert held is not None
    stripped = bundle()
    assert decide_bundle(held, None, stripped, CA_PEM, NOW).bundle is None
    swapped = bundle(ROOT_B_PEM)
    assert decide_bundle(held, signed(WORKER_B, swapped), swapped, CA_PEM, NOW).bundle is None


def test_junk_roots_neither_arrive_unsigned_nor_turn_checking_off() -> None:
    """A gateway offering a bundle of unreadable roots to a node without roots gets nothing adopted, and a
    bundle that somehow holds only unreadable roots refuses everything (fails closed) rather than nothing."""
    junk = bundle(b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")
    assert decide_bundle(NONE, None, junk, CA_PEM, NOW).bundle is None
    trust = AgentTrust(junk)
    unsigned = session_pb2.Command(envelope=common_pb2.Envelope(purpose=PURPOSE_COMMAND, body=b"\x0a\x01c"))
    assert trust.enforcing and trust.check_command(unsigned, NOW) == "unsigned"
    real = bundle(ROOT_A_PEM)
    assert decide_bundle(NONE, signed(WORKER_A, real), real, CA_PEM, NOW).bundle == real


# -- AgentTrust ----------------------------------------------------------------------------------


def command(
    kind: str = "inventory.refresh", attested: bool = False, signer: WorkerSigner | None = None
) -> session_pb2.Command:
    body = session_pb2.CommandBody(id="c-1", node_id="n1", seq=1, kind=kind, attested=attested)
    raw = body.SerializeToString(deterministic=True)
    env = signer.envelope(PURPOSE_COMMAND, raw) if signer else common_pb2.Envelope(purpose=PURPOSE_COMMAND, body=raw)
    return session_pb2.Command(envelope=env, attempt=1)


def spec_env(signer: WorkerSigner | None = None, purpose: str = PURPOSE_DESIRED_STATE) -> common_pb2.Envelope:
    raw = session_pb2.DesiredStateBody(node_id="n1", generation=2, spec_hash="sha256:x").SerializeToString()
    return signer.envelope(purpose, raw) if signer else common_pb2.Envelope(purpose=purpose, body=raw)


@pytest.mark.parametrize("held", [NONE, bundle(ca=CA_PEM)], ids=["empty", "ca-only"])
def test_without_roots_nothing_is_enforced(held: common_pb2.TrustBundle) -> None:
    t = AgentTrust(held)
    assert not t.enforcing
    assert t.check_command(command(), NOW) is None
    assert t.check_command(command("node.reboot", attested=True), NOW) is None
    assert t.check_spec(spec_env(), NOW) is None
    assert t.check_spec(common_pb2.Envelope(), NOW) is None


@pytest.mark.parametrize("kind", list(kinds.KINDS))
@pytest.mark.parametrize("attested", [False, True])
def test_with_roots_every_kind_needs_a_signature_whatever_the_body_says(kind: str, attested: bool) -> None:
    t = AgentTrust(HOLDING_A)
    assert t.enforcing
    assert t.check_command(command(kind, attested), NOW) == "unsigned"
    assert t.check_command(command(kind, attested, signer=WORKER_A), NOW) is None


@given(
    kind=st.text(max_size=20),
    attested=st.booleans(),
    retry_safe=st.booleans(),
    self_terminating=st.booleans(),
    batch_id=st.text(max_size=8),
)
def test_with_roots_no_body_field_waives_the_signature(
    kind: str, attested: bool, retry_safe: bool, self_terminating: bool, batch_id: str
) -> None:
    body = session_pb2.CommandBody(
        id="c",
        kind=kind,
        attested=attested,
        retry_safe=retry_safe,
        self_terminating=self_terminating,
        batch_id=batch_id,
    )
    cmd = session_pb2.Command(envelope=common_pb2.Envelope(purpose=PURPOSE_COMMAND, body=body.SerializeToString()))
    assert AgentTrust(HOLDING_A).check_command(cmd, NOW) is not None


def test_with_roots_a_command_from_another_roots_worker_is_refused() -> None:
    why = AgentTrust(HOLDING_A).check_command(command(signer=WORKER_B), NOW)
    assert why is not None and "does not chain" in why


def test_with_roots_a_command_signed_as_a_spec_is_refused_and_the_reverse() -> None:
    t = AgentTrust(HOLDING_A)
    as_spec = command()
    as_spec.envelope.CopyFrom(WORKER_A.envelope(PURPOSE_DESIRED_STATE, as_spec.envelope.body))
    assert "purpose" in (t.check_command(as_spec, NOW) or "")
    assert "purpose" in (t.check_spec(spec_env(WORKER_A, PURPOSE_COMMAND), NOW) or "")


def test_with_roots_a_command_outside_its_signers_window_is_refused() -> None:
    t = AgentTrust(HOLDING_A)
    why = t.check_command(command(signer=WORKER_A), NOW + WORKER_LIFETIME_S + 1)
    assert why is not None and "not valid at this time" in why
    assert t.check_command(command(signer=WORKER_A), None) is None


def test_with_roots_specs_need_a_signature() -> None:
    t = AgentTrust(HOLDING_A)
    assert t.check_spec(spec_env(), NOW) == "unsigned"
    assert t.check_spec(spec_env(WORKER_A), NOW) is None
    assert "does not chain" in (t.check_spec(spec_env(WORKER_B), NOW) or "")
    tampered = spec_env(WORKER_A)
    tampered.body += b"\x10\x03"
    assert "does not match the body" in (t.check_spec(tampered, NOW) or "")


def test_set_replaces_the_roots_and_forgets_what_was_verified_under_the_old_ones() -> None:
    t = AgentTrust(HOLDING_A)
    assert t.check_command(command(signer=WORKER_A), NOW) is None  # warms the verifier's cache
    t.set(bundle(ROOT_B_PEM))
    assert t.bundle == bundle(ROOT_B_PEM)
    assert "does not chain" in (t.check_command(command(signer=WORKER_A), NOW) or "")
    assert t.check_command(command(signer=WORKER_B), NOW) is None
    t.set(NONE)
    assert not t.enforcing and t.check_command(command(), NOW) is None


def test_a_bundle_whose_only_root_is_unreadable_still_enforces_signatures() -> None:
    """ "An unreadable root trusts nothing" (signing.Verifier): with only unreadable roots it trusts everything.

    The bundle holds a command-signing root, so by the rule "once the bundle holds roots every command
    needs a signature" an unsigned command must be refused; `enforcing` is False instead.
    """
    t = AgentTrust(bundle(b"not a pem"))
    assert t.check_command(command(), NOW) is not None


def test_neither_a_worker_nor_the_root_alone_may_change_the_quorum_settings() -> None:
    """A stolen worker key cannot drop the approvers (switching the quorum off) nor install its own, and the
    root's own signature is not enough either while approvers are held: a change also needs their approvals
    (tests/unit/agent/test_trust_quorum.py walks those)."""
    approver = common_pb2.ApproverKey(key_id="sha256:aa", public_key=b"k" * 32, name="alice")
    held = bundle(ROOT_A_PEM, quorum_k=2)
    held.approver_keys.append(approver)
    dropped = bundle(ROOT_A_PEM)
    d = decide_bundle(held, signed(WORKER_A, dropped), dropped, CA_PEM, NOW)
    assert d.bundle is None and "root's own signature" in d.reason
    lowered = bundle(ROOT_A_PEM, quorum_k=1)
    lowered.approver_keys.append(approver)
    assert decide_bundle(held, signed(WORKER_A, lowered), lowered, CA_PEM, NOW).bundle is None
    d = decide_bundle(held, signed(ROOT_SIGNER_A, lowered), lowered, CA_PEM, NOW)
    assert d.bundle is None and "no approved quorum change leads" in d.reason
    # Another root's key is no root of ours.
    assert decide_bundle(held, signed(WorkerSigner(ROOT_KEY_B, ROOT_B), dropped), dropped, CA_PEM, NOW).bundle is None


# -- release keys (docs/self-update.md) ------------------------------------------------------------


def test_release_keys_arrive_only_under_the_roots_own_signature() -> None:
    offered = bundle(ROOT_A_PEM)
    offered.release_keys.append(b"\x01" * 32)
    by_worker = decide_bundle(HOLDING_A, signed(WORKER_A, offered), offered, CA_PEM, NOW)
    assert by_worker.bundle is None
    assert by_worker.reason.startswith("the release keys change only under the signing root's own signature")
    by_root = decide_bundle(HOLDING_A, signed(ROOT_SIGNER_A, offered), offered, CA_PEM, NOW)
    assert by_root.bundle == offered
    # Once held, the worker's signature still delivers the bundle (nothing about release keys changes).
    again = bundle(ROOT_A_PEM, ROOT_B_PEM)
    again.release_keys.append(b"\x01" * 32)
    assert decide_bundle(offered, signed(WORKER_A, again), again, CA_PEM, NOW).bundle == again


def endorsed(key: bytes, root_key: ed25519.Ed25519PrivateKey) -> common_pb2.ReleaseKeyEndorsement:
    from bc.pki import releases

    return common_pb2.ReleaseKeyEndorsement(public_key=key, root_signature=releases.endorse(root_key, key))


def test_a_worker_signed_bundle_adds_a_release_key_only_with_a_held_roots_endorsement() -> None:
    """The root kept offline (`bc release key add --root-key`): the bundle is the worker's, and the new key
    carries the root's own signature of it; without one, by another root or by the worker, it is refused."""
    new = b"\x02" * 32
    offered = bundle(ROOT_A_PEM)
    offered.release_keys.append(new)
    offered.release_key_endorsements.append(endorsed(new, ROOT_KEY_A))
    d = decide_bundle(HOLDING_A, signed(WORKER_A, offered), offered, CA_PEM, NOW)
    assert d.bundle == offered, d.reason
    for signer in (ROOT_KEY_B, WORKER_A.key):
        forged = bundle(ROOT_A_PEM)
        forged.release_keys.append(new)
        forged.release_key_endorsements.append(endorsed(new, signer))
        d = decide_bundle(HOLDING_A, signed(WORKER_A, forged), forged, CA_PEM, NOW)
        assert d.bundle is None and "carries no held root's endorsement" in d.reason, d.reason
    # An endorsement of another key does not vouch for this one.
    moved = bundle(ROOT_A_PEM)
    moved.release_keys.append(new)
    moved.release_key_endorsements.append(endorsed(b"\x03" * 32, ROOT_KEY_A))
    assert decide_bundle(HOLDING_A, signed(WORKER_A, moved), moved, CA_PEM, NOW).bundle is None
    # Once held, a worker-signed bundle may not drop it, endorsement or not.
    dropped = bundle(ROOT_A_PEM)
    d = decide_bundle(offered, signed(WORKER_A, dropped), dropped, CA_PEM, NOW)
    assert d.bundle is None and d.reason == "the release keys change only under the signing root's own signature"


def _bootstrap_step(
    root_key: ed25519.Ed25519PrivateKey | None,
) -> tuple[common_pb2.TrustBundle, common_pb2.TrustBundle]:
    """(held, offered): the first approver added (no approvals needed), its step signed by `root_key`."""
    from bc.pki import quorum as q

    held = bundle(ROOT_A_PEM)
    approver = common_pb2.ApproverKey(key_id="sha256:aa", public_key=b"k" * 32, name="alice", operator="alice")
    to = common_pb2.QuorumSettings(version=1, quorum_k=2)
    to.approver_keys.append(approver)
    change = common_pb2.QuorumChange(
        change_id="q-1", requested_by="local", from_digest=q.settings_digest(q.settings_of(held)), settings=to
    )
    if root_key is not None:
        change.root_signature = root_key.sign(q.root_change_message(change.from_digest, q.settings_digest(to)))
    offered = bundle(ROOT_A_PEM, quorum_k=2)
    offered.approver_keys.append(approver)
    offered.quorum_version = 1
    offered.quorum_changes.append(change)
    return held, offered


def test_a_worker_signed_bundle_moves_the_quorum_only_along_steps_the_root_itself_signed() -> None:
    """The root kept offline: the bundle is the worker's, and each change carries the root's signature of its
    step (made on the operator's machine with `--root-key`); without it, or by another root, it is refused."""
    held, offered = _bootstrap_step(ROOT_KEY_A)
    d = decide_bundle(held, signed(WORKER_A, offered), offered, CA_PEM, NOW)
    assert d.bundle is not None and d.bundle.quorum_version == 1, d.reason
    for key in (None, ROOT_KEY_B, WORKER_A.key):
        held, offered = _bootstrap_step(key)
        d = decide_bundle(held, signed(WORKER_A, offered), offered, CA_PEM, NOW)
        assert d.bundle is None and "root's own signature" in d.reason and "q-1" in d.reason, (key, d.reason)
    # A root-signed step does not let a worker-signed bundle change the release keys.
    held, offered = _bootstrap_step(ROOT_KEY_A)
    offered.release_keys.append(b"r" * 32)
    d = decide_bundle(held, signed(WORKER_A, offered), offered, CA_PEM, NOW)
    assert d.bundle is None and "release keys" in d.reason
