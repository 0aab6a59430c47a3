"""Approver sets built as an install builds them: operators, then each change signed by the approvers there."""

from __future__ import annotations

import base64
import random

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from bc.control.base.bus import Bus
from bc.control.quorum import approvers
from bc.pki import quorum as q
from bc.store import Store
from bc.store import operators as ops_sql

RNG = random.Random(1)  # the one Random of these tests' "process": two seeded alike would make the same ids

ADMIN = "local"  # the operator who asks for every change here; never an approver's operator


def raw(key: ed25519.Ed25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def b64(key: ed25519.Ed25519PrivateKey) -> str:
    return base64.b64encode(raw(key)).decode()


async def add_operator(store: Store, name: str, role: str = "operator") -> None:
    async with store.transaction() as tx:
        await ops_sql.insert(tx, name, role, ADMIN, await store.now_ms())


async def sign_change(
    store: Store, bus: Bus | None, change_id: str, keys: dict[str, ed25519.Ed25519PrivateKey]
) -> approvers.ApproverSet:
    """Approve a pending change with the keys of current approvers (by name) until it applies."""
    info = await approvers.get_change(store, change_id)
    from_digest, to_digest = q.settings_digest(info.from_settings), q.settings_digest(info.to_settings)
    msg = q.change_message(change_id, from_digest, to_digest, info.requested_by)
    for a in info.from_settings.approver_keys:
        if (await approvers.get_change(store, change_id)).state != "pending":
            break
        key = keys.get(a.name)
        if key is None or q.is_requesters(a, info.requested_by):
            continue
        await approvers.decide(
            store, bus, change_id, a.key_id, key.sign(msg), approve=True, caller=a.operator or "someone"
        )
    assert (await approvers.get_change(store, change_id)).state == "applied"
    return await approvers.approver_set(store)


async def change(
    store: Store,
    bus: Bus | None,
    edit: approvers.Edit,
    keys: dict[str, ed25519.Ed25519PrivateKey],
    requested_by: str = ADMIN,
) -> approvers.ApproverSet:
    """Propose `edit` and, when the settings are guarded, have the current approvers sign it."""
    proposed = await approvers.propose(store, bus, edit, requested_by, RNG)
    if proposed.state == "pending":
        return await sign_change(store, bus, proposed.change_id, keys)
    return await approvers.approver_set(store)


async def install(
    store: Store,
    bus: Bus | None,
    keys: dict[str, ed25519.Ed25519PrivateKey],
    k: int = 2,
    operators: dict[str, str] | None = None,
) -> approvers.ApproverSet:
    """Each name an approver (held by the operator of the same name unless `operators` says), then k."""
    for name, key in keys.items():
        operator = (operators or {}).get(name, name)
        async with store.transaction(write=False) as tx:
            known = await ops_sql.get(tx, operator) is not None
        if not known:
            await add_operator(store, operator)
        await change(store, bus, approvers.AddApprover(name, b64(key), operator), keys)
    return await change(store, bus, approvers.SetThreshold(k), keys)
