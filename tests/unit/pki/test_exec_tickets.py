"""Exec tickets (bc.pki.exec_tickets): what a node accepts, and every way it refuses, by reason code."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bc.errors import TicketRefused, UsageError
from bc.pki import exec_tickets as et
from bc.pki.secrets_source import SystemSecrets, ed25519_key

KEY = et.new_key("k1", ed25519_key(SystemSecrets()))
OTHER = et.new_key("k2", ed25519_key(SystemSecrets()))
JWKS = et.jwks_json([et.public_jwk(KEY)])
T = et.Ticket("j1", "t-1", "n1", "alice", "forward", 9100, 1_000, 1_060, "k1")
NOW = 1_030_000


def refused(token: str, jwks: str = JWKS, node_id: str = "n1", sid: str = "t-1", now_ms: int = NOW) -> str:
    with pytest.raises(TicketRefused) as e:
        et.verify(token, jwks, node_id=node_id, sid=sid, now_ms=now_ms)
    return e.value.reason


def test_a_good_ticket_verifies_and_reads_back() -> None:
    assert et.verify(et.issue(KEY, T), JWKS, node_id="n1", sid="t-1", now_ms=NOW) == T
    assert et.peek(et.issue(KEY, T)) == T


@pytest.mark.parametrize(
    ("change", "kwargs", "reason"),
    [
        ({}, {"node_id": "n2"}, "wrong-node"),
        ({}, {"sid": "t-2"}, "wrong-sid"),
        ({}, {"now_ms": 1_060_000}, "expired"),
        ({"exp_s": 1_000 + et.MAX_TTL_S + 1}, {}, "too-long"),
        ({"iat_s": 1_200, "exp_s": 1_260}, {}, "too-long"),
        ({"purpose": "root"}, {}, "bad-ticket"),
        ({"port": 0}, {}, "bad-ticket"),
    ],
)
def test_the_node_refuses(change: dict[str, object], kwargs: dict[str, object], reason: str) -> None:
    assert refused(et.issue(KEY, dataclasses.replace(T, **change)), **kwargs) == reason  # type: ignore[arg-type]


def test_another_key_or_no_key_set_is_refused() -> None:
    assert refused(et.issue(OTHER, dataclasses.replace(T, kid="k2"))) == "unknown-key"
    forged = et.issue(et.new_key("k1", ed25519_key(SystemSecrets())), T)  # the right kid, another key
    assert refused(forged) == "bad-ticket"
    assert refused(et.issue(KEY, T), jwks="") == "unknown-key"
    assert refused(et.issue(KEY, T), jwks=et.jwks_json([et.public_jwk(OTHER)])) == "unknown-key"


@given(st.text(max_size=200))
def test_garbage_is_refused_never_raised_otherwise(token: str) -> None:
    with pytest.raises(TicketRefused):
        et.verify(token, JWKS, node_id="n1", sid="t-1", now_ms=NOW)


@given(st.integers(0, 10_000), st.sampled_from(range(0, 300, 7)))
def test_any_changed_byte_of_the_signature_or_claims_is_refused(pos: int, flip: int) -> None:
    token = et.issue(KEY, T)
    i = pos % len(token)
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    if token[i] == ".":
        return
    c = alphabet[(alphabet.index(token[i]) + 1 + flip % 63) % 64]
    changed = token[:i] + c + token[i + 1 :]
    if changed == token:
        return
    try:
        got = et.verify(changed, JWKS, node_id="n1", sid="t-1", now_ms=NOW)
    except TicketRefused:
        return
    assert got == T  # base64's last character may carry unused bits: the same bytes, the same ticket


def test_requests_are_checked_before_anything_is_issued() -> None:
    assert et.check_request("shell", 0, "disk full", 0) == (22, et.DEFAULT_TTL_S)
    assert et.check_request("forward", 9100, "", 300) == (9100, 300)
    for args, words in [
        (("shell", 0, " ", 0), "needs a reason"),
        (("forward", 0, "", 0), "not between 1 and 65535"),
        (("sudo", 22, "", 0), "not one of"),
        (("exec", 22, "", 301), "at most 300"),
    ]:
        with pytest.raises(UsageError, match=words):
            et.check_request(*args)  # type: ignore[arg-type]
