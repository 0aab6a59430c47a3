"""The node's own key as a signer: terminal results and allocation reports, across a key renewal."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from agent.node_key import TERMINAL, NodeKey
from bc.pki import attest, keys
from bc.pki.ca import CertificateAuthority
from bc.pki.identity import make_csr
from bc.pki.secrets_source import SystemSecrets
from bc.protocol.pb import session_pb2
from bc.testing import virtual_clock

RNG = random.Random(1)  # ids and serials, as the one seeded Random of a process would give them
SECRETS = SystemSecrets()

CA = CertificateAuthority.create(virtual_clock(1_800_000_000.0), RNG, SECRETS)
TERMINAL_STATES = [
    session_pb2.COMMAND_SUCCEEDED,
    session_pb2.COMMAND_FAILED,
    session_pb2.COMMAND_REJECTED,
    session_pb2.COMMAND_CANCELLED,
]
PROGRESS_STATES = [session_pb2.COMMAND_STATE_UNSPECIFIED, session_pb2.COMMAND_ACKED, session_pb2.COMMAND_RUNNING]


@pytest.fixture
def key_path(tmp_path: Path) -> Path:
    path = tmp_path / "node.key"
    keys.write_private_key(path, keys.generate_key())
    return path


def public_of(path: Path) -> keys.PublicKey:
    return keys.load_key_pem(path.read_bytes()).public_key()


def update(
    state: session_pb2.CommandState, command_id: str = "c-1", result: bytes = b'{"ok": true}'
) -> session_pb2.CommandUpdate:
    return session_pb2.CommandUpdate(
        command_id=command_id,
        state=state,
        result=result,
        reason="r",
        message="m",
        boot_id="b-1",
    )


def result_msg(u: session_pb2.CommandUpdate) -> bytes:
    return attest.result_message(u.command_id, session_pb2.CommandState.Name(u.state), u.result)


def test_terminal_is_exactly_the_settled_states() -> None:
    assert set(TERMINAL) == set(TERMINAL_STATES)


@pytest.mark.parametrize("state", TERMINAL_STATES, ids=session_pb2.CommandState.Name)
def test_a_terminal_update_is_signed_in_place_and_verifies(key_path: Path, state: session_pb2.CommandState) -> None:
    nk = NodeKey(key_path)
    u = update(state)
    out = nk.attest_update(u)
    assert out is u and u.node_sig
    assert attest.verify(public_of(key_path), result_msg(u), u.node_sig)
    # The fields outside the signature are untouched.
    assert (u.reason, u.message, u.boot_id) == ("r", "m", "b-1")


@pytest.mark.parametrize("state", PROGRESS_STATES, ids=session_pb2.CommandState.Name)
def test_progress_updates_carry_no_signature(key_path: Path, state: session_pb2.CommandState) -> None:
    u = NodeKey(key_path).attest_update(update(state))
    assert u.node_sig == b""


def test_the_signature_binds_the_state_and_the_result(key_path: Path) -> None:
    u = NodeKey(key_path).attest_update(update(session_pb2.COMMAND_SUCCEEDED))
    pub = public_of(key_path)
    assert not attest.verify(pub, attest.result_message("c-1", "COMMAND_FAILED", u.result), u.node_sig)
    assert not attest.verify(pub, attest.result_message("c-1", "COMMAND_SUCCEEDED", b"{}"), u.node_sig)
    assert not attest.verify(pub, attest.result_message("c-2", "COMMAND_SUCCEEDED", u.result), u.node_sig)


def test_the_control_plane_verifies_it_against_the_node_certificate(key_path: Path) -> None:
    key = keys.load_key_pem(key_path.read_bytes())
    cert = CA.issue_node_cert(make_csr(key, "n1"), "n1", "node", 1)
    u = NodeKey(key_path).attest_update(update(session_pb2.COMMAND_FAILED, result=b""))
    assert attest.verify_by_any([cert], result_msg(u), u.node_sig)


def test_attest_update_is_idempotent(key_path: Path) -> None:
    """ECDSA signatures are randomized: a second signing would change the bytes; it must not happen."""
    nk = NodeKey(key_path)
    u = nk.attest_update(update(session_pb2.COMMAND_SUCCEEDED))
    first = u.node_sig
    assert nk.attest_update(u).node_sig == first
    # Also across a round trip through the journal's bytes.
    again = nk.attest_update(session_pb2.CommandUpdate.FromString(u.SerializeToString()))
    assert again.node_sig == first


def test_a_renewed_key_file_is_read_again(key_path: Path) -> None:
    nk = NodeKey(key_path)
    old_pub = public_of(key_path)
    before = nk.attest_update(update(session_pb2.COMMAND_SUCCEEDED, "c-1"))
    assert attest.verify(old_pub, result_msg(before), before.node_sig)

    keys.write_private_key(key_path, keys.generate_key())  # a renewal replaces the file atomically
    new_pub = public_of(key_path)
    after = nk.attest_update(update(session_pb2.COMMAND_SUCCEEDED, "c-2"))
    assert attest.verify(new_pub, result_msg(after), after.node_sig)
    assert not attest.verify(old_pub, result_msg(after), after.node_sig)
    # The report signer follows the same key.
    rep = nk.sign_report(b"report")
    assert attest.verify(new_pub, attest.report_message(b"report"), rep.node_sig)


def test_a_key_rewritten_in_place_is_read_again(key_path: Path) -> None:
    """Same inode, new content: the modification time tells the change."""
    nk = NodeKey(key_path)
    nk.sign(b"warm")
    st = key_path.stat()
    key_path.write_bytes(keys.key_to_pem(keys.generate_key()))
    os.utime(key_path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert key_path.stat().st_ino == st.st_ino
    msg = attest.report_message(b"x")
    assert attest.verify(public_of(key_path), msg, nk.sign(msg))


def test_an_unchanged_file_is_not_read_again(key_path: Path) -> None:
    """Between renewals the key is cached: a signature made later still verifies under the same key."""
    nk = NodeKey(key_path)
    pub = public_of(key_path)
    msgs = [attest.report_message(bytes([i])) for i in range(3)]
    assert all(attest.verify(pub, m, nk.sign(m)) for m in msgs)


def test_sign_report_signs_the_body_behind_the_report_prefix(key_path: Path) -> None:
    body = session_pb2.AttestedReport(body=b"inner").SerializeToString()
    rep = NodeKey(key_path).sign_report(body)
    assert rep.body == body
    pub = public_of(key_path)
    assert attest.verify(pub, attest.report_message(body), rep.node_sig)
    assert not attest.verify(pub, body, rep.node_sig)
