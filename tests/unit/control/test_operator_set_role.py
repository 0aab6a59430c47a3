"""`bc operators role NAME ROLE` on the server (bc.control.trust.operators.set_role), against the real store."""

from __future__ import annotations

import json

import pytest

from bc.control.base.bus import Bus
from bc.control.trust import operators as ops
from bc.errors import Conflict, NotFound, Unauthenticated, UsageError
from bc.pki.ca import CertificateAuthority
from bc.store import events as events_sql
from bc.store.sqlite import InlineSqliteStore
from tests.unit.control.test_operators import add, ca  # noqa: F401  (ca: the fixture)


async def test_a_role_change_applies_at_the_next_call_and_is_an_event(
    store: InlineSqliteStore,
    bus: Bus,
    ca: CertificateAuthority,  # noqa: F811
) -> None:
    bob = await add(store, bus, ca, "bob", "operator")
    assert (await ops.authorize(store, bob, "operator", "reserving GPUs")).role == "operator"
    row = await ops.set_role(store, bus, "bob", "viewer", "moved to support", "local")
    assert row["role"] == "viewer"
    with pytest.raises(Unauthenticated, match=r"^reserving GPUs needs the operator role; operator bob has the viewer"):
        await ops.authorize(store, bob, "operator", "reserving GPUs")
    async with store.transaction(write=False) as tx:
        last = (await events_sql.list_events(tx, 0, 100, "operator."))[-1]
    assert (str(last["type"]), json.loads(str(last["data"]))) == (
        "operator.role",
        {"from": "operator", "to": "viewer", "reason": "moved to support", "by": "local"},
    )


async def test_a_role_change_refuses_the_last_admin_a_revoked_operator_and_nonsense(
    store: InlineSqliteStore,
    bus: Bus,
    ca: CertificateAuthority,  # noqa: F811
) -> None:
    await add(store, bus, ca, "bob", "operator")
    with pytest.raises(Conflict, match="operator local is the last admin"):
        await ops.set_role(store, bus, "local", "operator", "", "local")
    with pytest.raises(Conflict, match="already has the operator role"):
        await ops.set_role(store, bus, "bob", "operator", "", "local")
    with pytest.raises(UsageError, match="is not one of viewer, operator, admin"):
        await ops.set_role(store, bus, "bob", "root", "", "local")
    with pytest.raises(NotFound, match="no operator named 'nobody'"):
        await ops.set_role(store, bus, "nobody", "viewer", "", "local")
    await ops.revoke(store, bus, "bob", "left", "local")
    with pytest.raises(Conflict, match="operator bob is revoked"):
        await ops.set_role(store, bus, "bob", "admin", "", "local")
