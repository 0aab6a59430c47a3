"""Signed intent: command-signing roots, worker keys, envelopes, and the verifier a node holds."""

from __future__ import annotations

import datetime
import random
import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519
from cryptography.x509.oid import NameOID
from hypothesis import given
from hypothesis import strategies as st

from bc.errors import UsageError
from bc.pki import keys
from bc.pki.secrets_source import SystemSecrets
from bc.pki.signing import (
    PURPOSE_COMMAND,
    PURPOSE_DESIRED_STATE,
    PURPOSE_TRUST_BUNDLE,
    ROOT_CERT,
    ROOT_KEY,
    SIGNING_DIR,
    WORKER_CERT,
    WORKER_KEY,
    WORKER_LIFETIME_S,
    BadSignature,
    SigningKeys,
    Verifier,
    WorkerSigner,
    create_root,
    issue_worker,
    key_id_of,
    signed_message,
)
from bc.protocol.pb import common_pb2
from bc.testing import advance, virtual_clock

RNG = random.Random(1)  # ids and serials, as the one seeded Random of a process would give them
SECRETS = SystemSecrets()

NOW = 1_800_000_000.0
PURPOSES = (PURPOSE_COMMAND, PURPOSE_DESIRED_STATE, PURPOSE_TRUST_BUNDLE)

# Made once: Hypothesis examples reuse them.
_CLOCK = virtual_clock(NOW)
ROOT_KEY_A, ROOT_A = create_root(_CLOCK, RNG, SECRETS)
WORKER_A = WorkerSigner(*issue_worker(ROOT_KEY_A, ROOT_A, _CLOCK, RNG, SECRETS))
ROOT_KEY_B, ROOT_B = create_root(_CLOCK, RNG, SECRETS)
WORKER_B = WorkerSigner(*issue_worker(ROOT_KEY_B, ROOT_B, _CLOCK, RNG, SECRETS))


def pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def der(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.DER)


def verifier_a() -> Verifier:
    return Verifier([pem(ROOT_A)])


def cert_under_root_a(
    public_key: ed25519.Ed25519PublicKey | ec.EllipticCurvePublicKey,
    signer: ed25519.Ed25519PrivateKey | ec.EllipticCurvePrivateKey = ROOT_KEY_A,
    issuer: x509.Name | None = None,
) -> x509.Certificate:
    """A leaf naming root A as issuer, signed by `signer` (root A's key unless a forger's)."""
    now = keys.utc(NOW - 60)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "bc-worker:odd")]))
        .issuer_name(issuer or ROOT_A.subject)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=30))
    )
    algorithm = None if isinstance(signer, ed25519.Ed25519PrivateKey) else hashes.SHA256()
    return builder.sign(signer, algorithm)


# -- the signed message --------------------------------------------------------------------------


def test_the_signed_message_is_domain_separated_by_purpose() -> None:
    assert signed_message("command", b"body") == b"bc.v1/envelope\ncommand\nbody"
    assert signed_message("desired-state", b"body") != signed_message("command", b"body")


def test_key_id_names_the_certificate_der() -> None:
    assert WORKER_A.key_id == key_id_of(WORKER_A.cert) == keys.fingerprint(WORKER_A.cert)
    assert WORKER_A.key_id.startswith("sha256:") and len(WORKER_A.key_id) == len("sha256:") + 64
    assert WORKER_A.cert_der == der(WORKER_A.cert)
    assert WORKER_A.key_id != WORKER_B.key_id


# -- roots and workers ---------------------------------------------------------------------------


def test_a_root_is_a_self_signed_ed25519_ca() -> None:
    assert isinstance(ROOT_A.public_key(), ed25519.Ed25519PublicKey)
    assert ROOT_A.issuer == ROOT_A.subject
    ROOT_A.verify_directly_issued_by(ROOT_A)
    bc_ext = ROOT_A.extensions.get_extension_for_class(x509.BasicConstraints).value
    assert bc_ext.ca and bc_ext.path_length == 0
    assert ROOT_A.subject != ROOT_B.subject  # each root is its own name


def test_a_worker_is_an_ed25519_leaf_issued_by_its_root() -> None:
    cert = WORKER_A.cert
    assert isinstance(cert.public_key(), ed25519.Ed25519PublicKey)
    cn = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value
    assert cn == "bc-worker:serve"
    cert.verify_directly_issued_by(ROOT_A)
    assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    lifetime = cert.not_valid_after_utc - cert.not_valid_before_utc
    assert lifetime.total_seconds() == WORKER_LIFETIME_S
    # Back-dated a minute so that a slightly slow node clock still accepts a fresh key.
    assert cert.not_valid_before_utc.timestamp() == NOW - 60
    assert WORKER_A.not_after == cert.not_valid_after_utc.timestamp()


def test_envelope_carries_purpose_body_key_id_signature_and_certificate() -> None:
    env = WORKER_A.envelope(PURPOSE_COMMAND, b"hello")
    assert (env.purpose, env.body, env.key_id) == (PURPOSE_COMMAND, b"hello", WORKER_A.key_id)
    assert list(env.cert_chain) == [WORKER_A.cert_der]
    pub = WORKER_A.cert.public_key()
    assert isinstance(pub, ed25519.Ed25519PublicKey)
    pub.verify(env.signature, signed_message(PURPOSE_COMMAND, b"hello"))  # raises if it does not hold


# -- SigningKeys on disk -------------------------------------------------------------------------


def test_create_writes_root_and_worker_with_private_keys_0600(tmp_path: Path) -> None:
    sk = SigningKeys.create(tmp_path, virtual_clock(NOW), RNG, SECRETS)
    d = tmp_path / SIGNING_DIR
    assert sk.dir == d
    for name in (ROOT_KEY, ROOT_CERT, WORKER_KEY, WORKER_CERT):
        assert (d / name).is_file(), name
    assert stat.S_IMODE((d / ROOT_KEY).stat().st_mode) == 0o600
    assert stat.S_IMODE((d / WORKER_KEY).stat().st_mode) == 0o600
    assert SigningKeys.exists(tmp_path)
    assert sk.root_pem == (d / ROOT_CERT).read_bytes()
    sk.worker.cert.verify_directly_issued_by(sk.root)


def test_exists_is_false_for_an_empty_pki_dir(tmp_path: Path) -> None:
    assert not SigningKeys.exists(tmp_path)


def test_create_refuses_to_replace_an_existing_root(tmp_path: Path) -> None:
    sk = SigningKeys.create(tmp_path, virtual_clock(NOW), RNG, SECRETS)
    before = (tmp_path / SIGNING_DIR / ROOT_CERT).read_bytes()
    with pytest.raises(UsageError, match="already holds a command-signing root"):
        SigningKeys.create(tmp_path, virtual_clock(NOW), RNG, SECRETS)
    assert (tmp_path / SIGNING_DIR / ROOT_CERT).read_bytes() == before == sk.root_pem


def test_create_refuses_when_only_the_root_key_is_left(tmp_path: Path) -> None:
    SigningKeys.create(tmp_path, virtual_clock(NOW), RNG, SECRETS)
    (tmp_path / SIGNING_DIR / ROOT_CERT).unlink()
    with pytest.raises(UsageError, match="refusing to replace it"):
        SigningKeys.create(tmp_path, virtual_clock(NOW), RNG, SECRETS)


def test_load_gives_back_the_same_root_and_worker(tmp_path: Path) -> None:
    sk = SigningKeys.create(tmp_path, virtual_clock(NOW), RNG, SECRETS)
    again = SigningKeys.load(tmp_path)
    assert again.root_pem == sk.root_pem
    assert again.worker.key_id == sk.worker.key_id
    # The loaded private key is the same key: its envelopes verify under the stored certificate.
    env = again.worker.envelope(PURPOSE_COMMAND, b"x")
    assert Verifier([sk.root_pem]).verify(env, PURPOSE_COMMAND, NOW) == sk.worker.key_id


def test_load_of_a_missing_directory_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="unreadable"):
        SigningKeys.load(tmp_path)


def test_load_of_a_corrupt_certificate_is_a_usage_error(tmp_path: Path) -> None:
    SigningKeys.create(tmp_path, virtual_clock(NOW), RNG, SECRETS)
    (tmp_path / SIGNING_DIR / WORKER_CERT).write_bytes(b"not a certificate")
    with pytest.raises(UsageError, match="unreadable"):
        SigningKeys.load(tmp_path)


def test_load_refuses_a_worker_key_that_is_not_ed25519(tmp_path: Path) -> None:
    SigningKeys.create(tmp_path, virtual_clock(NOW), RNG, SECRETS)
    keys.write_private_key(tmp_path / SIGNING_DIR / WORKER_KEY, keys.generate_key())
    with pytest.raises(UsageError, match="not an Ed25519 private key"):
        SigningKeys.load(tmp_path)


async def test_rotate_worker_issues_a_new_key_under_the_same_root_and_persists_it(tmp_path: Path) -> None:
    clock = virtual_clock(NOW)
    sk = SigningKeys.create(tmp_path, clock, RNG, SECRETS)
    old = sk.worker
    await advance(3600)
    new = sk.rotate_worker(clock, RNG, SECRETS)
    assert sk.worker is new and new.key_id != old.key_id
    new.cert.verify_directly_issued_by(sk.root)
    assert new.cert.not_valid_before_utc.timestamp() == NOW + 3600 - 60
    loaded = SigningKeys.load(tmp_path)
    assert loaded.worker.key_id == new.key_id and loaded.root_pem == sk.root_pem
    v = Verifier([sk.root_pem])
    assert v.verify(new.envelope(PURPOSE_COMMAND, b"b"), PURPOSE_COMMAND, clock.now()) == new.key_id


def test_rotating_without_the_root_key_on_this_host_is_a_usage_error(tmp_path: Path) -> None:
    """The docstring says a fleet may keep the root offline; `bc pki rotate` then must fail in one sentence.

    Today `rotate_worker` lets FileNotFoundError escape (a traceback / INTERNAL, and a crash of
    `bc serve` at start when the worker key is close to expiry).
    """
    clock = virtual_clock(NOW)
    sk = SigningKeys.create(tmp_path, clock, RNG, SECRETS)
    (tmp_path / SIGNING_DIR / ROOT_KEY).unlink()
    with pytest.raises(UsageError):
        sk.rotate_worker(clock, RNG, SECRETS)


# -- Verifier ------------------------------------------------------------------------------------


@pytest.mark.parametrize("purpose", PURPOSES)
def test_a_worker_envelope_verifies_for_its_purpose(purpose: str) -> None:
    env = WORKER_A.envelope(purpose, b"body")
    assert verifier_a().verify(env, purpose, NOW) == WORKER_A.key_id


@given(signed_as=st.sampled_from(PURPOSES), checked_as=st.sampled_from(PURPOSES), body=st.binary(max_size=64))
def test_a_signature_for_one_purpose_never_verifies_as_another(signed_as: str, checked_as: str, body: bytes) -> None:
    env = WORKER_A.envelope(signed_as, body)
    v = verifier_a()
    if signed_as == checked_as:
        assert v.verify(env, checked_as, NOW) == WORKER_A.key_id
        return
    with pytest.raises(BadSignature, match="purpose"):
        v.verify(env, checked_as, NOW)
    # Relabelling the envelope does not help: the purpose is inside what was signed.
    env.purpose = checked_as
    with pytest.raises(BadSignature, match="does not match the body"):
        v.verify(env, checked_as, NOW)


@given(body=st.binary(max_size=64), flip=st.integers(min_value=0, max_value=63), bit=st.integers(0, 7))
def test_any_change_to_the_body_breaks_the_signature(body: bytes, flip: int, bit: int) -> None:
    env = WORKER_A.envelope(PURPOSE_DESIRED_STATE, body)
    if body:
        i = flip % len(body)
        env.body = body[:i] + bytes([body[i] ^ (1 << bit)]) + body[i + 1 :]
    else:
        env.body = b"\x00"
    with pytest.raises(BadSignature, match="does not match the body"):
        verifier_a().verify(env, PURPOSE_DESIRED_STATE, NOW)


def test_an_unsigned_envelope_is_refused() -> None:
    env = common_pb2.Envelope(purpose=PURPOSE_COMMAND, body=b"b")
    with pytest.raises(BadSignature, match="unsigned"):
        verifier_a().verify(env, PURPOSE_COMMAND, NOW)
    # Carrying the worker's certificate and key id does not make it signed.
    env.key_id, env.cert_chain[:] = WORKER_A.key_id, [WORKER_A.cert_der]
    with pytest.raises(BadSignature, match="unsigned"):
        verifier_a().verify(env, PURPOSE_COMMAND, NOW)


def test_a_signature_without_a_certificate_is_refused() -> None:
    env = WORKER_A.envelope(PURPOSE_COMMAND, b"b")
    del env.cert_chain[:]
    with pytest.raises(BadSignature, match="no signer certificate"):
        verifier_a().verify(env, PURPOSE_COMMAND, NOW)


def test_an_unreadable_certificate_is_refused() -> None:
    env = WORKER_A.envelope(PURPOSE_COMMAND, b"b")
    env.cert_chain[:] = [b"\x30\x03garbage"]
    with pytest.raises(BadSignature, match="unreadable signer certificate"):
        verifier_a().verify(env, PURPOSE_COMMAND, NOW)


@pytest.mark.parametrize(
    "key_id",
    ["", "sha256:" + "0" * 64, WORKER_B.key_id, key_id_of(ROOT_A)],
    ids=["empty", "unknown", "another-worker", "a-root"],
)
def test_the_key_id_must_name_the_certificate_carried(key_id: str) -> None:
    env = WORKER_A.envelope(PURPOSE_COMMAND, b"b")
    env.key_id = key_id
    with pytest.raises(BadSignature, match="key id does not name the signer certificate"):
        verifier_a().verify(env, PURPOSE_COMMAND, NOW)


def test_a_worker_of_another_root_is_refused() -> None:
    env = WORKER_B.envelope(PURPOSE_COMMAND, b"b")
    with pytest.raises(BadSignature, match="does not chain to a command-signing root"):
        verifier_a().verify(env, PURPOSE_COMMAND, NOW)
    # Holding both roots, it verifies.
    assert Verifier([pem(ROOT_A), pem(ROOT_B)]).verify(env, PURPOSE_COMMAND, NOW) == WORKER_B.key_id


def test_a_certificate_naming_the_root_but_signed_by_a_forger_is_refused() -> None:
    forger = ed25519.Ed25519PrivateKey.generate()
    cert = cert_under_root_a(forger.public_key(), signer=forger)
    assert cert.issuer == ROOT_A.subject
    w = WorkerSigner(forger, cert)
    with pytest.raises(BadSignature, match="does not chain"):
        verifier_a().verify(w.envelope(PURPOSE_COMMAND, b"b"), PURPOSE_COMMAND, NOW)


def test_a_certificate_issued_by_a_worker_is_refused() -> None:
    """A worker key cannot mint further workers: only a root is an issuer."""
    key = ed25519.Ed25519PrivateKey.generate()
    cert = cert_under_root_a(key.public_key(), signer=WORKER_A.key, issuer=WORKER_A.cert.subject)
    with pytest.raises(BadSignature, match="does not chain"):
        verifier_a().verify(WorkerSigner(key, cert).envelope(PURPOSE_COMMAND, b"b"), PURPOSE_COMMAND, NOW)


def test_a_signer_key_that_is_not_ed25519_is_refused_even_when_the_root_issued_it() -> None:
    ec_key = ec.generate_private_key(ec.SECP256R1())
    cert = cert_under_root_a(ec_key.public_key())
    cert.verify_directly_issued_by(ROOT_A)  # a genuine certificate of root A
    env = common_pb2.Envelope(
        purpose=PURPOSE_COMMAND,
        body=b"b",
        key_id=key_id_of(cert),
        signature=ec_key.sign(signed_message(PURPOSE_COMMAND, b"b"), ec.ECDSA(hashes.SHA256())),
        cert_chain=[der(cert)],
    )
    with pytest.raises(BadSignature, match="not Ed25519"):
        verifier_a().verify(env, PURPOSE_COMMAND, NOW)


def test_no_roots_means_nothing_verifies_and_nothing_is_enforced() -> None:
    v = Verifier([])
    assert not v.enforcing
    with pytest.raises(BadSignature, match="does not chain"):
        v.verify(WORKER_A.envelope(PURPOSE_COMMAND, b"b"), PURPOSE_COMMAND, NOW)


def test_an_unreadable_root_trusts_nothing_but_the_others_still_count() -> None:
    v = Verifier([b"-----BEGIN CERTIFICATE-----\nnope\n-----END CERTIFICATE-----\n", pem(ROOT_A)])
    assert v.enforcing and len(v.roots) == 1
    assert v.verify(WORKER_A.envelope(PURPOSE_COMMAND, b"b"), PURPOSE_COMMAND, NOW) == WORKER_A.key_id
    with pytest.raises(BadSignature, match="does not chain"):
        v.verify(WORKER_B.envelope(PURPOSE_COMMAND, b"b"), PURPOSE_COMMAND, NOW)


def test_the_validity_window_is_checked_at_the_given_time_inclusive() -> None:
    nb = WORKER_A.cert.not_valid_before_utc.timestamp()
    na = WORKER_A.cert.not_valid_after_utc.timestamp()
    env = WORKER_A.envelope(PURPOSE_COMMAND, b"b")
    v = verifier_a()
    for at in (nb, na, (nb + na) / 2):
        assert v.verify(env, PURPOSE_COMMAND, at) == WORKER_A.key_id
    for at in (nb - 1, na + 1, 0.0):
        with pytest.raises(BadSignature, match="not valid at this time"):
            v.verify(env, PURPOSE_COMMAND, at)
    # `at=None` skips the window (a spec re-read from the node's own journal).
    assert v.verify(env, PURPOSE_COMMAND, None) == WORKER_A.key_id


def test_an_expired_worker_is_refused_on_first_sight_too() -> None:
    env = WORKER_A.envelope(PURPOSE_COMMAND, b"b")
    with pytest.raises(BadSignature, match="not valid at this time"):
        verifier_a().verify(env, PURPOSE_COMMAND, NOW + WORKER_LIFETIME_S + 3600)


# -- the per-key-id cache ------------------------------------------------------------------------


def test_the_cache_does_not_skip_the_signature_check() -> None:
    v = verifier_a()
    good = WORKER_A.envelope(PURPOSE_COMMAND, b"b")
    assert v.verify(good, PURPOSE_COMMAND, NOW) == WORKER_A.key_id
    tampered = WORKER_A.envelope(PURPOSE_COMMAND, b"b")
    tampered.body = b"c"
    with pytest.raises(BadSignature, match="does not match the body"):
        v.verify(tampered, PURPOSE_COMMAND, NOW)
    with pytest.raises(BadSignature, match="unsigned"):
        v.verify(common_pb2.Envelope(purpose=PURPOSE_COMMAND, body=b"b", key_id=WORKER_A.key_id), PURPOSE_COMMAND, NOW)


def test_a_cached_key_id_with_another_certificate_cannot_smuggle_in_a_foreign_signer() -> None:
    """Same key_id as a worker already trusted, but the certificate and signature of another root's worker.

    The cache maps the key id to the *trusted* public key, so the foreign signature is checked
    against that key and fails: the substituted certificate is never believed.
    """
    v = verifier_a()
    assert v.verify(WORKER_A.envelope(PURPOSE_COMMAND, b"warm"), PURPOSE_COMMAND, NOW) == WORKER_A.key_id
    forged = WORKER_B.envelope(PURPOSE_COMMAND, b"rm -rf")
    forged.key_id = WORKER_A.key_id
    with pytest.raises(BadSignature, match="does not match the body"):
        v.verify(forged, PURPOSE_COMMAND, NOW)
    # A self-made Ed25519 key under a forged "root A" issuer fares no better.
    rogue = ed25519.Ed25519PrivateKey.generate()
    rogue_signer = WorkerSigner(rogue, cert_under_root_a(rogue.public_key(), signer=rogue))
    forged = rogue_signer.envelope(PURPOSE_COMMAND, b"rm -rf")
    forged.key_id = WORKER_A.key_id
    with pytest.raises(BadSignature, match="does not match the body"):
        v.verify(forged, PURPOSE_COMMAND, NOW)


def test_a_cached_key_id_keeps_its_validity_window() -> None:
    v = verifier_a()
    env = WORKER_A.envelope(PURPOSE_COMMAND, b"b")
    assert v.verify(env, PURPOSE_COMMAND, NOW) == WORKER_A.key_id
    with pytest.raises(BadSignature, match="not valid at this time"):
        v.verify(env, PURPOSE_COMMAND, NOW + WORKER_LIFETIME_S + 1)


def test_a_refused_signer_is_not_cached_as_trusted() -> None:
    v = verifier_a()
    env = WORKER_B.envelope(PURPOSE_COMMAND, b"b")
    for _ in range(2):
        with pytest.raises(BadSignature, match="does not chain"):
            v.verify(env, PURPOSE_COMMAND, NOW)


def test_a_cached_worker_needs_no_certificate_on_later_envelopes() -> None:
    """Documented behaviour: the key id commits to the certificate, so later envelopes may omit it."""
    v = verifier_a()
    assert v.verify(WORKER_A.envelope(PURPOSE_COMMAND, b"1"), PURPOSE_COMMAND, NOW) == WORKER_A.key_id
    env = WORKER_A.envelope(PURPOSE_COMMAND, b"2")
    env.cert_chain[:] = [WORKER_B.cert_der]  # whatever is carried is ignored for a known key id
    assert v.verify(env, PURPOSE_COMMAND, NOW) == WORKER_A.key_id
    # A fresh verifier (a new trust bundle) knows nothing and checks the certificate again.
    with pytest.raises(BadSignature, match="key id does not name"):
        verifier_a().verify(env, PURPOSE_COMMAND, NOW)


def test_a_rotated_worker_of_the_same_root_verifies_and_the_old_one_still_does(tmp_path: Path) -> None:
    clock = virtual_clock(NOW)
    sk = SigningKeys.create(tmp_path, clock, RNG, SECRETS)
    old = sk.worker
    new = sk.rotate_worker(clock, RNG, SECRETS)
    v = Verifier([sk.root_pem])
    assert v.verify(old.envelope(PURPOSE_COMMAND, b"b"), PURPOSE_COMMAND, NOW) == old.key_id
    assert v.verify(new.envelope(PURPOSE_COMMAND, b"b"), PURPOSE_COMMAND, NOW) == new.key_id


def test_a_root_cannot_sign_intent_itself() -> None:
    """Roots certify workers; an envelope signed by the root key (naming the root as signer) is refused."""
    root_as_signer = WorkerSigner(ROOT_KEY_A, ROOT_A)
    env = root_as_signer.envelope(PURPOSE_COMMAND, b"body")
    with pytest.raises(BadSignature, match="not a worker's"):
        verifier_a().verify(env, PURPOSE_COMMAND, NOW)


def test_an_issued_worker_is_installed_only_if_it_is_a_valid_worker_of_this_root(tmp_path: Path) -> None:
    """`bc pki rotate --root-key`: the operator's CLI issues the worker; anything else changes nothing."""
    from bc.pki.secrets_source import SeededSecrets
    from bc.testing import virtual_clock

    ser = serialization
    now = 1_800_000_000.0
    clock, rng, secrets = virtual_clock(now), random.Random(3), SeededSecrets(3)
    sk = SigningKeys.create(tmp_path / "pki", clock, rng, secrets)
    root_key = ser.load_pem_private_key((sk.dir / "root.key").read_bytes(), None)
    assert isinstance(root_key, ed25519.Ed25519PrivateKey)

    def pem(key: ed25519.Ed25519PrivateKey) -> bytes:
        return key.private_bytes(ser.Encoding.PEM, ser.PrivateFormat.PKCS8, ser.NoEncryption())

    def cert_pem(c: x509.Certificate) -> bytes:
        return c.public_bytes(ser.Encoding.PEM)

    other_key, other_root = create_root(clock, rng, secrets)
    wk, wc = issue_worker(root_key, sk.root, clock, rng, secrets)
    ok, oc = issue_worker(other_key, other_root, clock, rng, secrets)
    before = (sk.dir / "worker.crt").read_bytes()
    bad = [
        (pem(ok), cert_pem(oc), "not issued by this install's command-signing root"),
        (pem(ok), cert_pem(wc), "not for the key sent with it"),
        (pem(root_key), cert_pem(sk.root), "not a worker certificate"),
        (b"junk", cert_pem(wc), "does not parse"),
        (pem(wk), b"junk", "does not parse"),
    ]
    for key_pem, c_pem, fragment in bad:
        with pytest.raises(UsageError, match=fragment):
            sk.install_worker(key_pem, c_pem, now)
        assert (sk.dir / "worker.crt").read_bytes() == before
    with pytest.raises(UsageError, match="not valid now"):
        sk.install_worker(pem(wk), cert_pem(wc), now + 80 * 24 * 3600)
    w = sk.install_worker(pem(wk), cert_pem(wc), now)
    assert SigningKeys.load(tmp_path / "pki").worker.key_id == w.key_id != ""
