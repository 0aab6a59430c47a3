"""The control plane's signer and trust bundle: signing, the signed bundle, and rotating the worker key."""

from __future__ import annotations

import json
import random
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from google.protobuf import any_pb2

from agent.trust import decide_bundle
from bc.control.base.bus import Bus
from bc.control.commands.queue import EnqueueRequest, enqueue
from bc.control.nodes.specs import write_spec
from bc.control.signing.signer import KeySigner, NullSigner, Signer
from bc.control.trust.intent import Intent, register, rotate
from bc.errors import UsageError
from bc.pki import keys
from bc.pki.ca import CertificateAuthority
from bc.pki.secrets_source import SystemSecrets
from bc.pki.signing import (
    PURPOSE_COMMAND,
    PURPOSE_DESIRED_STATE,
    PURPOSE_TRUST_BUNDLE,
    BadSignature,
    SigningKeys,
    Verifier,
)
from bc.protocol.pb import common_pb2, spec_pb2
from bc.seams.clock import LoopClock
from bc.store import Row
from bc.store import commands as cmd_sql
from bc.store import events as events_sql
from bc.store import nodes as nodes_sql
from bc.store import signing as signing_sql
from bc.store.sqlite import InlineSqliteStore
from bc.testing import advance

AddNode = Callable[..., Awaitable[common_pb2.Inventory]]
Count = Callable[[str], Awaitable[int]]

SECRETS = SystemSecrets()
LIVE = ("pending", "dispatched", "acked", "running")
SETTLED = ("succeeded", "failed", "rejected", "cancelled", "expired")


@pytest.fixture
def ca_pem(clock: LoopClock, rng: random.Random) -> bytes:
    return CertificateAuthority.create(clock, rng, SECRETS).ca_pem


def key_signer(pki_dir: Path, clock: LoopClock) -> KeySigner:
    return KeySigner(SigningKeys.create(pki_dir, clock, random.Random(11), SECRETS))


@pytest.fixture
def keyed(tmp_path: Path, clock: LoopClock) -> KeySigner:
    return key_signer(tmp_path / "pki", clock)


@pytest.fixture
def intent(keyed: KeySigner, ca_pem: bytes) -> Intent:
    return Intent(keyed, ca_pem=ca_pem)


async def set_telemetry(store: InlineSqliteStore, bus: Bus, signer: Signer, node_id: str, endpoint: str) -> int:
    def mutate(spec: spec_pb2.NodeSpec) -> None:
        spec.telemetry.otlp_endpoint = endpoint

    now_ms = await store.now_ms()
    async with store.transaction() as tx:
        return (await write_spec(tx, bus, signer, node_id, mutate, now_ms)).generation


async def node_row(store: InlineSqliteStore, node_id: str) -> Row:
    async with store.transaction(write=False) as tx:
        row = await nodes_sql.get(tx, node_id)
    assert row is not None
    return row


async def command_row(store: InlineSqliteStore, command_id: str) -> Row:
    async with store.transaction(write=False) as tx:
        row = await cmd_sql.get(tx, command_id)
    assert row is not None
    return row


async def put(store: InlineSqliteStore, bus: Bus, signer: Signer, node_id: str, rng: random.Random) -> str:
    row = await enqueue(store, bus, signer, EnqueueRequest(node_id, "inventory.refresh", any_pb2.Any()), rng)
    return str(row["id"])


async def set_state(store: InlineSqliteStore, command_id: str, state: str) -> None:
    async with store.transaction() as tx:
        await tx.execute("UPDATE commands SET state = :s WHERE id = :id", {"s": state, "id": command_id})


async def events(store: InlineSqliteStore, prefix: str) -> list[Row]:
    async with store.transaction(write=False) as tx:
        return await events_sql.list_events(tx, 0, 1000, prefix)


async def relayed_cert(store: InlineSqliteStore, key_id: str) -> bytes:
    """What a gateway sends beside the stored bytes: the signer's certificate from the store."""
    async with store.transaction(write=False) as tx:
        der = await signing_sql.get_cert(tx, key_id)
    assert der is not None, f"no certificate stored for {key_id}"
    return der


async def spec_envelope(store: InlineSqliteStore, node_id: str) -> common_pb2.Envelope:
    row = await node_row(store, node_id)
    key_id = str(row["spec_key_id"])
    return common_pb2.Envelope(
        purpose=PURPOSE_DESIRED_STATE,
        body=bytes(row["spec_body"]),
        key_id=key_id,
        signature=bytes(row["spec_signature"] or b""),
        cert_chain=[await relayed_cert(store, key_id)] if key_id else [],
    )


async def command_envelope(store: InlineSqliteStore, command_id: str) -> common_pb2.Envelope:
    row = await command_row(store, command_id)
    key_id = str(row["signer_key_id"])
    return common_pb2.Envelope(
        purpose=PURPOSE_COMMAND,
        body=bytes(row["body"]),
        key_id=key_id,
        signature=bytes(row["signature"] or b""),
        cert_chain=[await relayed_cert(store, key_id)] if key_id else [],
    )


# -- signing on or off ---------------------------------------------------------------------------


def test_without_keys_bundles_carry_no_roots_and_no_envelope(ca_pem: bytes) -> None:
    it = Intent(NullSigner(), ca_pem=ca_pem)
    assert it.trust_bundle() == common_pb2.TrustBundle(ca_pem=ca_pem)
    assert it.trust_envelope() is None


async def test_without_keys_rotate_is_refused_and_changes_nothing(
    store: InlineSqliteStore, bus: Bus, clock: LoopClock, rng: random.Random
) -> None:
    with pytest.raises(UsageError, match="command signing is off"):
        await rotate(store, bus, NullSigner(), clock, rng, SECRETS)
    await register(store, NullSigner())  # a no-op
    assert await events(store, "pki.") == []


def test_with_keys_commands_and_specs_are_signed_for_their_purposes(keyed: KeySigner, clock: LoopClock) -> None:
    assert keyed.attested
    w = keyed.keys.worker
    v = Verifier([keyed.keys.root_pem])
    cmd, spec = keyed.sign_command(b"body"), keyed.sign_spec(b"body")
    assert cmd.key_id == spec.key_id == w.key_id
    env = common_pb2.Envelope(
        purpose=PURPOSE_COMMAND, body=b"body", key_id=w.key_id, signature=cmd.signature, cert_chain=[w.cert_der]
    )
    assert v.verify(env, PURPOSE_COMMAND, clock.now()) == w.key_id
    env.purpose, env.signature = PURPOSE_DESIRED_STATE, spec.signature
    assert v.verify(env, PURPOSE_DESIRED_STATE, clock.now()) == w.key_id
    # A command signature is not a spec signature.
    env.signature = cmd.signature
    with pytest.raises(BadSignature):
        v.verify(env, PURPOSE_DESIRED_STATE, clock.now())


# -- the trust bundle ----------------------------------------------------------------------------


def test_the_trust_bundle_holds_the_ca_and_the_command_signing_root(
    intent: Intent, keyed: KeySigner, ca_pem: bytes
) -> None:
    assert intent.trust_bundle() == common_pb2.TrustBundle(ca_pem=ca_pem, command_signing_roots=[keyed.keys.root_pem])


def test_the_trust_envelope_is_signed_by_the_root_itself(intent: Intent, keyed: KeySigner) -> None:
    """The root key is on this host (a lab): it signs the bundle, so approver changes reach the nodes."""
    env = intent.trust_envelope()
    assert env is not None
    assert env.purpose == PURPOSE_TRUST_BUNDLE and env.key_id == keys.fingerprint(keyed.keys.root)
    assert Verifier([keyed.keys.root_pem]).verify_by_root(env, PURPOSE_TRUST_BUNDLE)
    assert common_pb2.TrustBundle.FromString(env.body) == intent.trust_bundle()
    assert intent.trust_envelope() is env  # built once until the bundle changes


def test_the_bundle_changes_only_when_the_quorum_settings_do(intent: Intent) -> None:
    """The settings come in from the store's reader (`approvers.trust_state`); an unchanged read changes nothing."""
    env = intent.trust_envelope()
    settings = common_pb2.QuorumSettings(version=1)
    settings.approver_keys.add(key_id="k1", name="alice", public_key=b"\x01" * 32)
    assert not intent.set_quorum(common_pb2.QuorumSettings(), [])
    assert intent.trust_envelope() is env
    assert intent.set_quorum(settings, [])
    assert intent.trust_bundle().quorum_version == 1 and [a.name for a in intent.approvers] == ["alice"]
    again = intent.trust_envelope()
    assert again is not env and again is not None
    assert common_pb2.TrustBundle.FromString(again.body) == intent.trust_bundle()
    assert not intent.set_quorum(settings, [])


async def test_without_the_root_key_the_worker_signs_the_bundle(
    keyed: KeySigner, ca_pem: bytes, clock: LoopClock
) -> None:
    (keyed.keys.dir / "root.key").unlink()  # a fleet keeps the root offline
    env = Intent(keyed, ca_pem=ca_pem).trust_envelope()
    assert env is not None and env.key_id == keyed.keys.worker.key_id
    assert Verifier([keyed.keys.root_pem]).verify(env, PURPOSE_TRUST_BUNDLE, clock.now()) == env.key_id


async def test_a_node_takes_the_signed_bundle_and_keeps_it_across_a_rotation(
    store: InlineSqliteStore,
    bus: Bus,
    keyed: KeySigner,
    intent: Intent,
    clock: LoopClock,
    ca_pem: bytes,
    rng: random.Random,
) -> None:
    env = intent.trust_envelope()
    assert env is not None
    first = decide_bundle(common_pb2.TrustBundle(), env, intent.trust_bundle(), ca_pem, clock.now())
    assert first.bundle == intent.trust_bundle() and first.reason == "first signed bundle"
    await rotate(store, bus, keyed, clock, rng, SECRETS)
    again = decide_bundle(first.bundle, intent.trust_envelope(), intent.trust_bundle(), ca_pem, clock.now())
    assert again.bundle is None and again.reason == "unchanged"


async def test_a_node_of_another_install_refuses_this_bundle(
    tmp_path: Path, intent: Intent, clock: LoopClock, ca_pem: bytes
) -> None:
    other = Intent(key_signer(tmp_path / "other", clock), ca_pem=ca_pem)
    held = other.trust_bundle()
    d = decide_bundle(held, intent.trust_envelope(), intent.trust_bundle(), ca_pem, clock.now())
    assert d.bundle is None and "does not chain" in d.reason


# -- register ------------------------------------------------------------------------------------


async def test_register_stores_the_worker_certificate_once(
    store: InlineSqliteStore, keyed: KeySigner, count: Count
) -> None:
    await register(store, keyed)
    await register(store, keyed)
    assert await relayed_cert(store, keyed.keys.worker.key_id) == keyed.keys.worker.cert_der
    assert await count("signing_certs") == 1


# -- rotate --------------------------------------------------------------------------------------


async def test_rotate_resigns_current_specs_without_touching_their_bodies(
    store: InlineSqliteStore, bus: Bus, keyed: KeySigner, clock: LoopClock, add_node: AddNode, rng: random.Random
) -> None:
    for n in ("n1", "n2", "n3"):
        await add_node(n, profile=None)
    await register(store, keyed)
    await set_telemetry(store, bus, keyed, "n1", "http://a:4317")
    await set_telemetry(store, bus, keyed, "n1", "http://b:4317")  # generation 2 is the current one
    await set_telemetry(store, bus, keyed, "n2", "http://c:4317")
    # n3 has no spec at all: nothing to sign.
    old_key = keyed.keys.worker.key_id
    before = {n: await node_row(store, n) for n in ("n1", "n2", "n3")}
    assert str(before["n1"]["spec_key_id"]) == old_key and int(before["n1"]["generation"]) == 2

    await advance(60)
    specs, cmds = await rotate(store, bus, keyed, clock, rng, SECRETS)
    assert (specs, cmds) == (2, 0)

    new_key = keyed.keys.worker.key_id
    assert new_key != old_key
    v = Verifier([keyed.keys.root_pem])
    for n in ("n1", "n2"):
        after = await node_row(store, n)
        assert bytes(after["spec_body"]) == bytes(before[n]["spec_body"])
        assert (after["generation"], after["spec_hash"], after["spec"]) == (
            before[n]["generation"],
            before[n]["spec_hash"],
            before[n]["spec"],
        )
        assert str(after["spec_key_id"]) == new_key
        assert bytes(after["spec_signature"]) != bytes(before[n]["spec_signature"])
        assert v.verify(await spec_envelope(store, n), PURPOSE_DESIRED_STATE, clock.now()) == new_key
    n3 = await node_row(store, "n3")
    assert n3["spec_body"] is None and n3["spec_signature"] is None and n3["spec_key_id"] == ""


async def test_rotate_signs_a_spec_written_while_signing_was_off(
    store: InlineSqliteStore, bus: Bus, tmp_path: Path, clock: LoopClock, add_node: AddNode, rng: random.Random
) -> None:
    await add_node("n1", profile=None)
    await set_telemetry(store, bus, NullSigner(), "n1", "http://a:4317")
    row = await node_row(store, "n1")
    assert row["spec_signature"] is None and row["spec_key_id"] == ""
    keyed = key_signer(tmp_path / "pki", clock)
    assert await rotate(store, bus, keyed, clock, rng, SECRETS) == (1, 0)
    v = Verifier([keyed.keys.root_pem])
    assert v.verify(await spec_envelope(store, "n1"), PURPOSE_DESIRED_STATE, clock.now()) == keyed.keys.worker.key_id
    assert bytes((await node_row(store, "n1"))["spec_body"]) == bytes(row["spec_body"])


async def test_rotate_resigns_only_commands_that_may_still_be_delivered(
    store: InlineSqliteStore, bus: Bus, keyed: KeySigner, clock: LoopClock, add_node: AddNode
) -> None:
    await add_node("n1", profile=None)
    rng = random.Random(3)
    ids = {state: await put(store, bus, keyed, "n1", rng) for state in (*LIVE, *SETTLED)}
    for state, cid in ids.items():
        await set_state(store, cid, state)
    before = {cid: await command_row(store, cid) for cid in ids.values()}
    old_key = keyed.keys.worker.key_id

    specs, cmds = await rotate(store, bus, keyed, clock, rng, SECRETS)
    assert (specs, cmds) == (0, len(LIVE))
    new_key = keyed.keys.worker.key_id
    v = Verifier([keyed.keys.root_pem])
    for state, cid in ids.items():
        after = await command_row(store, cid)
        assert bytes(after["body"]) == bytes(before[cid]["body"]), state
        assert after["state"] == state
        if state in LIVE:
            assert str(after["signer_key_id"]) == new_key
            assert v.verify(await command_envelope(store, cid), PURPOSE_COMMAND, clock.now()) == new_key
        else:
            assert str(after["signer_key_id"]) == old_key
            assert bytes(after["signature"]) == bytes(before[cid]["signature"])


async def test_rotate_signs_pending_commands_queued_while_signing_was_off(
    store: InlineSqliteStore, bus: Bus, tmp_path: Path, clock: LoopClock, add_node: AddNode, rng: random.Random
) -> None:
    await add_node("n1", profile=None)
    cid = await put(store, bus, NullSigner(), "n1", rng)
    assert (await command_row(store, cid))["signature"] is None
    keyed = key_signer(tmp_path / "pki", clock)
    assert await rotate(store, bus, keyed, clock, rng, SECRETS) == (0, 1)
    v = Verifier([keyed.keys.root_pem])
    assert v.verify(await command_envelope(store, cid), PURPOSE_COMMAND, clock.now()) == keyed.keys.worker.key_id


async def test_rotate_publishes_the_rotation_and_registers_the_new_certificate(
    store: InlineSqliteStore, bus: Bus, keyed: KeySigner, clock: LoopClock, add_node: AddNode
) -> None:
    await add_node("n1", profile=None)
    await set_telemetry(store, bus, keyed, "n1", "http://a:4317")
    rng = random.Random(5)
    live, settled = await put(store, bus, keyed, "n1", rng), await put(store, bus, keyed, "n1", rng)
    await set_state(store, settled, "succeeded")
    old_key = keyed.keys.worker.key_id

    await rotate(store, bus, keyed, clock, rng, SECRETS)
    new_key = keyed.keys.worker.key_id
    [ev] = await events(store, "pki.worker-rotated")
    assert ev["subject"] == new_key
    assert json.loads(ev["data"]) == {"previous_key_id": old_key, "resigned_specs": 1, "resigned_commands": 1}
    assert ev["at_ms"] == await store.now_ms()
    assert await relayed_cert(store, new_key) == keyed.keys.worker.cert_der
    assert (await command_row(store, live))["signer_key_id"] == new_key
    assert (await command_row(store, settled))["signer_key_id"] == old_key


async def test_rotate_persists_the_new_worker_for_the_next_start(
    store: InlineSqliteStore, bus: Bus, keyed: KeySigner, clock: LoopClock, tmp_path: Path, rng: random.Random
) -> None:
    await rotate(store, bus, keyed, clock, rng, SECRETS)
    loaded = SigningKeys.load(tmp_path / "pki")
    assert loaded.worker.key_id == keyed.keys.worker.key_id
    assert loaded.root_pem == keyed.keys.root_pem


async def test_rotating_twice_resigns_everything_live_again(
    store: InlineSqliteStore, bus: Bus, keyed: KeySigner, clock: LoopClock, add_node: AddNode, rng: random.Random
) -> None:
    await add_node("n1", profile=None)
    await set_telemetry(store, bus, keyed, "n1", "http://a:4317")
    cid = await put(store, bus, keyed, "n1", rng)
    assert await rotate(store, bus, keyed, clock, rng, SECRETS) == (1, 1)
    assert await rotate(store, bus, keyed, clock, rng, SECRETS) == (1, 1)
    v = Verifier([keyed.keys.root_pem])
    assert v.verify(await command_envelope(store, cid), PURPOSE_COMMAND, clock.now()) == keyed.keys.worker.key_id
    assert v.verify(await spec_envelope(store, "n1"), PURPOSE_DESIRED_STATE, clock.now()) == keyed.keys.worker.key_id
    assert len(await events(store, "pki.worker-rotated")) == 2


async def test_rotate_without_a_bus_still_records_the_event(
    store: InlineSqliteStore, keyed: KeySigner, clock: LoopClock, rng: random.Random
) -> None:
    assert await rotate(store, None, keyed, clock, rng, SECRETS) == (0, 0)
    assert len(await events(store, "pki.worker-rotated")) == 1


async def test_specs_written_after_a_rotation_are_signed_by_the_new_worker(
    store: InlineSqliteStore, bus: Bus, keyed: KeySigner, clock: LoopClock, add_node: AddNode, rng: random.Random
) -> None:
    await add_node("n1", profile=None)
    await rotate(store, bus, keyed, clock, rng, SECRETS)
    await set_telemetry(store, bus, keyed, "n1", "http://z:4317")
    env = await spec_envelope(store, "n1")
    assert env.key_id == keyed.keys.worker.key_id
    assert Verifier([keyed.keys.root_pem]).verify(env, PURPOSE_DESIRED_STATE, clock.now()) == env.key_id
