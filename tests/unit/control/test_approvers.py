"""Changes of the quorum settings on the server (bc.control.quorum.approvers), against the real SQLite store.

With no approvers a change applies at once (the root alone guards it); with
approvers it waits for change_threshold of them, each under the certificate of
the operator its key is registered to, never the requester's; what is applied
is the chain a node walks (agent.trust.quorum_path) from any earlier settings.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric import ed25519

from agent.trust import quorum_path
from bc.control.base.bus import Bus
from bc.control.quorum import approvers as appr
from bc.control.signing.signer import NullSigner
from bc.control.trust.intent import Intent
from bc.errors import Conflict, NotFound, Unauthenticated, UsageError
from bc.pki import quorum as q
from bc.pki.ca import CertificateAuthority
from bc.pki.secrets_source import SystemSecrets
from bc.protocol.pb import common_pb2
from bc.seams.clock import LoopClock
from bc.store import events as events_sql
from bc.store import settings as settings_sql
from bc.store.sqlite import InlineSqliteStore
from bc.testing import advance
from tests.unit.control.quorum_setup import ADMIN, RNG, add_operator, b64, change, install, raw

SECRETS = SystemSecrets()

NAMES = ["alice", "bob", "carol"]


@pytest.fixture
def keys() -> dict[str, ed25519.Ed25519PrivateKey]:
    return {n: ed25519.Ed25519PrivateKey.generate() for n in [*NAMES, "dave"]}


@pytest.fixture
async def three(store: InlineSqliteStore, bus: Bus, keys: dict[str, ed25519.Ed25519PrivateKey]) -> None:
    """alice, bob and carol, k = 2 (settings version 3); dave is an operator without a key yet."""
    await install(store, bus, {n: keys[n] for n in NAMES}, k=2)
    await add_operator(store, "dave")


async def events(store: InlineSqliteStore, prefix: str = "quorum.") -> list[tuple[str, str, dict[str, Any]]]:
    async with store.transaction(write=False) as tx:
        rows = await events_sql.list_events(tx, 0, 10_000, prefix)
    return [(str(r["type"]), str(r["subject"]), json.loads(str(r["data"]))) for r in rows]


def kid(key: ed25519.Ed25519PrivateKey) -> str:
    return q.key_id(raw(key))


async def approve(
    store: InlineSqliteStore, bus: Bus, change_id: str, key: ed25519.Ed25519PrivateKey, caller: str
) -> None:
    info = await appr.get_change(store, change_id)
    msg = q.change_message(
        change_id, q.settings_digest(info.from_settings), q.settings_digest(info.to_settings), info.requested_by
    )
    await appr.decide(store, bus, change_id, kid(key), key.sign(msg), approve=True, caller=caller)


# -- bootstrap ---------------------------------------------------------------------------------------


async def test_with_no_approvers_a_change_applies_at_once(store: InlineSqliteStore, bus: Bus, keys: Any) -> None:
    await add_operator(store, "alice")
    proposed = await appr.propose(store, bus, appr.AddApprover("alice", b64(keys["alice"])), ADMIN, RNG)
    assert proposed.state == "applied"
    current = await appr.approver_set(store)
    assert [str(r["name"]) for r in current.approvers] == ["alice"] and current.version == 1
    info = await appr.get_change(store, proposed.change_id)
    assert (info.state, info.threshold, info.approvals) == ("applied", 0, 0)
    assert [e[0] for e in await events(store)] == ["quorum.change-requested", "quorum.changed"]


async def test_k_or_the_allowance_with_no_approvers_is_stored_but_moves_nothing_nodes_hold(
    store: InlineSqliteStore, bus: Bus
) -> None:
    before = await appr.trust_state(store)
    assert (await appr.propose(store, bus, appr.SetThreshold(3), ADMIN, RNG)).state == "unchanged"
    assert (await appr.propose(store, bus, appr.SetAllowance(4), ADMIN, RNG)).state == "unchanged"
    current = await appr.approver_set(store)
    assert (current.threshold, current.unbatched_per_hour, current.version) == (3, 4, 0)
    assert await appr.trust_state(store) == before


# -- a change with approvers present ----------------------------------------------------------------------


async def test_a_change_waits_for_k_approvals_of_the_current_approvers(
    store: InlineSqliteStore, bus: Bus, keys: Any, three: None
) -> None:
    before = await appr.trust_state(store)
    proposed = await appr.propose(store, bus, appr.SetThreshold(3), ADMIN, RNG)
    assert proposed.state == "pending"
    assert (await appr.approver_set(store)).threshold == 2 and await appr.trust_state(store) == before
    await approve(store, bus, proposed.change_id, keys["alice"], "alice")
    assert (await appr.get_change(store, proposed.change_id)).state == "pending"
    assert await appr.trust_state(store) == before
    await approve(store, bus, proposed.change_id, keys["carol"], "carol")
    info = await appr.get_change(store, proposed.change_id)
    assert (info.state, info.approvals) == ("applied", 2)
    assert {d.operator for d in info.decisions} == {"alice", "carol"}
    current = await appr.approver_set(store)
    assert (current.threshold, current.version) == (3, 4)
    settings, chain = await appr.trust_state(store)
    assert settings.quorum_k == 3 and chain[-1].change_id == proposed.change_id
    assert sorted(s.key_id for s in chain[-1].signatures) == sorted([kid(keys["alice"]), kid(keys["carol"])])


async def test_the_chain_the_server_keeps_is_a_path_nodes_walk_from_any_earlier_settings(
    store: InlineSqliteStore, bus: Bus, keys: Any, three: None
) -> None:
    signers = {n: keys[n] for n in NAMES}
    await change(store, bus, appr.AddApprover("dave", b64(keys["dave"])), signers)
    await change(store, bus, appr.RemoveApprover("bob"), signers)
    await change(store, bus, appr.SetAllowance(2), signers)
    settings, chain = await appr.trust_state(store)
    offered = common_pb2.TrustBundle(quorum_version=settings.version, quorum_k=settings.quorum_k)
    offered.approver_keys.extend(settings.approver_keys)
    offered.unbatched_destructive_per_hour = settings.unbatched_destructive_per_hour
    offered.quorum_changes.extend(chain)
    for c in chain:  # a node holding the settings any change moved from gets to the current ones
        held = common_pb2.TrustBundle(quorum_version=0)
        previous = [x for x in chain if x.settings.version == c.settings.version - 1]
        if previous:
            s = previous[0].settings
            held = common_pb2.TrustBundle(
                quorum_version=s.version,
                quorum_k=s.quorum_k,
                unbatched_destructive_per_hour=s.unbatched_destructive_per_hour,
            )
            held.approver_keys.extend(s.approver_keys)
        assert quorum_path(held, offered) is None, c.change_id
    assert [a.name for a in settings.approver_keys] == ["alice", "carol", "dave"] and settings.version == 6


async def test_the_intent_bundle_carries_the_settings_and_the_chain(
    store: InlineSqliteStore, bus: Bus, clock: LoopClock, keys: Any, three: None
) -> None:
    intent = Intent(NullSigner(), CertificateAuthority.create(clock, RNG, SECRETS).ca_pem)
    assert intent.set_quorum(*await appr.trust_state(store)) is True
    assert intent.set_quorum(*await appr.trust_state(store)) is False
    b = intent.trust_bundle()
    assert (b.quorum_version, b.quorum_k, len(b.approver_keys), len(b.quorum_changes)) == (3, 2, 3, 3)
    await change(store, bus, appr.SetThreshold(3), {n: keys[n] for n in NAMES})
    assert intent.set_quorum(*await appr.trust_state(store)) is True
    assert intent.trust_bundle().quorum_k == 3 and len(intent.trust_bundle().quorum_changes) == 4


async def test_one_change_is_pending_at_a_time_a_newer_one_supersedes_it_and_it_expires(
    store: InlineSqliteStore, bus: Bus, clock: LoopClock, keys: Any, three: None
) -> None:
    first = await appr.propose(store, bus, appr.SetThreshold(3), ADMIN, RNG)
    second = await appr.propose(store, bus, appr.SetAllowance(1), ADMIN, RNG)
    assert second.state == "pending"
    assert (await appr.get_change(store, first.change_id)).state == "superseded"
    superseded = [e for e in await events(store) if e[0] == "quorum.change-superseded"]
    assert superseded == [
        (
            "quorum.change-superseded",
            first.change_id,
            {"by": second.change_id, "requested_by": ADMIN, "was_requested_by": ADMIN},
        ),
    ]
    with pytest.raises(Conflict, match="is already superseded"):
        await approve(store, bus, first.change_id, keys["alice"], "alice")
    await advance(appr.CHANGE_TTL_S)
    assert (await appr.get_change(store, second.change_id)).state == "expired"
    with pytest.raises(Conflict, match="expired; ask for it again"):
        await approve(store, bus, second.change_id, keys["alice"], "alice")
    third = await appr.propose(store, bus, appr.SetAllowance(1), ADMIN, RNG)
    assert third.state == "pending"
    assert [c.id for c in await appr.list_changes(store, "expired")] == [second.change_id]
    assert [c.id for c in await appr.list_changes(store, "pending")] == [third.change_id]


async def test_a_change_only_the_requesters_keys_could_approve_is_refused(
    store: InlineSqliteStore, bus: Bus, keys: Any
) -> None:
    await install(store, bus, {"alice": keys["alice"]}, k=2)
    with pytest.raises(Conflict, match="needs 1 approvals of the current approvers, and only 0 are not alice's own"):
        await appr.propose(store, bus, appr.SetThreshold(1), "alice", RNG)
    assert await appr.list_changes(store, "pending") == []


# -- who may decide -------------------------------------------------------------------------------------------


async def test_a_decision_counts_only_under_its_keys_operator_and_never_the_requesters(
    store: InlineSqliteStore, bus: Bus, keys: Any, three: None
) -> None:
    proposed = await appr.propose(store, bus, appr.SetThreshold(3), "bob", RNG)
    cid = proposed.change_id
    with pytest.raises(Unauthenticated, match=r"registered to operator alice: .* not carol's"):
        await approve(store, bus, cid, keys["alice"], "carol")
    with pytest.raises(UsageError, match=f"bob asked for quorum change {cid}"):
        await approve(store, bus, cid, keys["bob"], "bob")
    with pytest.raises(UsageError, match="is not an approver key of the quorum this change moves from"):
        await approve(store, bus, cid, keys["dave"], "dave")
    info = await appr.get_change(store, cid)
    forged = keys["dave"].sign(q.change_message(cid, q.settings_digest(info.from_settings), b"x", "bob"))
    with pytest.raises(UsageError, match="does not verify with alice's key"):
        await appr.decide(store, bus, cid, kid(keys["alice"]), forged, approve=True, caller="alice")
    assert (await appr.get_change(store, cid)).decisions == []
    await approve(store, bus, cid, keys["alice"], "alice")
    with pytest.raises(Conflict, match=f"alice has already decided on quorum change {cid}"):
        await approve(store, bus, cid, keys["alice"], "alice")
    await approve(store, bus, cid, keys["carol"], "carol")
    with pytest.raises(Conflict, match="is already applied"):
        await approve(store, bus, cid, keys["bob"], "bob")
    with pytest.raises(NotFound, match="no quorum change named 'q-nope'"):
        await approve(store, bus, "q-nope", keys["alice"], "alice")


async def test_one_rejection_fails_a_change(store: InlineSqliteStore, bus: Bus, keys: Any, three: None) -> None:
    before = await appr.trust_state(store)
    cid = (await appr.propose(store, bus, appr.RemoveApprover("carol"), ADMIN, RNG)).change_id
    info = await appr.get_change(store, cid)
    to_digest = q.settings_digest(info.to_settings)
    with pytest.raises(UsageError, match="needs a reason"):
        await appr.decide(store, bus, cid, kid(keys["carol"]), b"", approve=False, caller="carol", reason=" ")
    sig = keys["carol"].sign(q.change_rejection_message(cid, to_digest, "keep me"))
    with pytest.raises(Unauthenticated):
        await appr.decide(store, bus, cid, kid(keys["carol"]), sig, approve=False, caller="bob", reason="keep me")
    await appr.decide(store, bus, cid, kid(keys["carol"]), sig, approve=False, caller="carol", reason="keep me")
    assert (await appr.get_change(store, cid)).state == "rejected"
    assert await appr.trust_state(store) == before
    assert ("quorum.change-rejected", cid, {"by": "carol", "reason": "keep me"}) in await events(store)


async def test_a_change_overtaken_by_other_settings_is_superseded_not_applied(
    store: InlineSqliteStore, bus: Bus, keys: Any, three: None
) -> None:
    cid = (await appr.propose(store, bus, appr.SetThreshold(3), ADMIN, RNG)).change_id
    async with store.transaction() as tx:  # the settings moved some other way (a restored backup, a bug)
        await settings_sql.put(tx, appr.VERSION_KEY, "9")
    await approve(store, bus, cid, keys["alice"], "alice")
    await approve(store, bus, cid, keys["bob"], "bob")
    assert (await appr.get_change(store, cid)).state == "superseded"
    assert (await appr.approver_set(store)).threshold == 2


async def test_removing_the_last_approver_turns_the_quorum_off_and_keeps_k(
    store: InlineSqliteStore, bus: Bus, keys: Any
) -> None:
    await install(store, bus, {"alice": keys["alice"], "bob": keys["bob"]}, k=2)
    signers = {"alice": keys["alice"], "bob": keys["bob"]}
    with pytest.raises(Conflict, match="would leave 1 live approver"):  # bob alone could pass no batch at k = 2
        await change(store, bus, appr.RemoveApprover("alice"), signers)
    await change(store, bus, appr.RemoveApprover("alice", threshold=1), signers)
    await change(store, bus, appr.RemoveApprover("bob"), signers)  # bob alone: all of the one there is
    settings, _ = await appr.trust_state(store)
    assert settings == common_pb2.QuorumSettings(version=settings.version) and settings.version == 4
    assert (await appr.approver_set(store)).threshold == 1


# -- the command-signing root's signature of each step ---------------------------------------------------


def seal(root: ed25519.Ed25519PrivateKey, on_host: bool) -> appr.RootSeal:
    return appr.RootSeal(raw(root), root.sign if on_host else None)


async def test_with_the_root_on_the_host_every_change_carries_its_signature_of_the_step(
    store: InlineSqliteStore, bus: Bus, keys: Any
) -> None:
    root = ed25519.Ed25519PrivateKey.generate()
    await add_operator(store, "alice")
    edit = appr.AddApprover("alice", b64(keys["alice"]))
    proposed = await appr.propose(store, bus, edit, ADMIN, RNG, root=seal(root, True))
    _, chain = await appr.trust_state(store)
    assert proposed.state == "applied" and len(chain) == 1
    assert q.root_signed(chain[0], [raw(root)]) and not q.root_signed(chain[0], [raw(keys["alice"])])


async def test_with_the_root_offline_a_change_needs_the_operators_signature_of_the_step(
    store: InlineSqliteStore, bus: Bus, keys: Any
) -> None:
    root, other = ed25519.Ed25519PrivateKey.generate(), ed25519.Ed25519PrivateKey.generate()
    offline = seal(root, False)
    await add_operator(store, "alice")
    edit = appr.AddApprover("alice", b64(keys["alice"]))
    with pytest.raises(UsageError, match="pass --root-key"):
        await appr.propose(store, bus, edit, ADMIN, RNG, root=offline)
    # The preview stores nothing and hands back both settings; another key's signature of them is refused.
    preview = await appr.propose(store, bus, edit, ADMIN, RNG, root=offline, preview=True)
    assert preview.state == "preview" and preview.frm is not None and preview.to is not None
    msg = q.root_change_message(q.settings_digest(preview.frm), q.settings_digest(preview.to))
    with pytest.raises(UsageError, match="does not cover this change"):
        await appr.propose(store, bus, edit, ADMIN, RNG, root=offline, given_root_signature=other.sign(msg))
    assert (await appr.approver_set(store)).approvers == [] and await events(store) == []
    proposed = await appr.propose(store, bus, edit, ADMIN, RNG, root=offline, given_root_signature=root.sign(msg))
    _, chain = await appr.trust_state(store)
    assert proposed.state == "applied" and chain[0].root_signature == root.sign(msg)
