"""A control plane with a stolen worker key cannot take a serial out of a node's KRL.

Taking a serial out of `access.revoked_serials` un-revokes a certificate:
root-equivalent in the one table (bc/protocol/root_equiv.py). The server
refused it without the quorum, but the node did not check it (it could not
tell an un-revoked serial from one the server pruned once its certificate
expired), so whoever holds the worker key could sign a spec that gives a
revoked certificate its logins back. Now the server keeps every revoked
serial and the node applies the same table: the spec is refused, the KRL
stays as it was, and `security.spec-rejected` names the serial.
"""

from __future__ import annotations

import json
from typing import Any

from bc.control.nodes import specs
from bc.control.trust import ssh
from bc.protocol.pb import spec_pb2
from bc.store import ssh as ssh_sql
from tests.integration import conftest as lab_fixtures
from tests.integration.conftest import InprocLab
from tests.integration.operators_lab import approvers
from tests.integration.test_compromised_gateway import until
from tests.security.rootequiv_helpers import generation, holds_approvers, node

lab, store_url = lab_fixtures.lab, lab_fixtures.store_url  # the in-process lab, on each store


def unrevoke_9(spec: spec_pb2.NodeSpec) -> None:
    spec.access.revoked_serials.remove("9")


async def test_a_serial_taken_out_of_the_krl_without_the_quorum_is_refused(lab: InprocLab) -> None:
    await node(lab)
    # Two revoked certificates on the node, set while no approvers existed (the admin alone was enough).
    await lab.admin.set_spec_section("n1", "access", json.dumps({"revoked_serials": ["7", "9"]}))
    revoked = await generation(lab)
    await until(lambda: lab.agents["n1"].applied_generation == revoked)
    await approvers(lab, n=2, k=2)
    await holds_approvers(lab, 2)

    held = lab.agents["n1"].applied_generation
    server = lab.server
    async with server.store.transaction() as tx:  # the worker key signs; no batch, no approval
        w = await specs.write_spec(tx, server.bus, server.signer, "n1", unrevoke_9, await server.store.now_ms())
    ev = await lab.wait_event(
        "security.spec-rejected", lambda ev, d: ev.subject == "n1" and d["generation"] == w.generation
    )
    sec: dict[str, Any] = json.loads(ev.data_json)
    assert "ROOT_EQUIVALENT" in sec["reason"] and "removes 9 from access.revoked_serials" in sec["reason"]
    assert lab.agents["n1"].applied_generation == held
    assert list(lab.agents["n1"].state.spec.access.revoked_serials) == ["7", "9"]


async def test_an_expired_revoked_certificate_stays_in_the_krl(lab: InprocLab) -> None:
    """The server half: the next SSH write keeps a revoked serial whose certificate expired, so a node that
    checks removals never sees one from an honest control plane (before, it was pruned)."""
    await node(lab)
    server = lab.server
    now_ms = await server.store.now_ms()
    valid_before = now_ms + 300
    async with server.store.transaction() as tx:
        await ssh_sql.insert_grant(
            tx,
            serial=4242,
            node_id="n1",
            principal="oncall",
            public_key="ssh-ed25519 AAAA",
            fingerprint="SHA256:x",
            ttl_s=1,
            state="pending",
            batch_id="",
            requested_by="local",
            reason="test",
            now_ms=now_ms,
        )
        assert await ssh_sql.issue(tx, 4242, "cert", now_ms, valid_before)
        assert await ssh_sql.revoke(tx, 4242, "local", "done", now_ms)
        await ssh.sync_access(tx, server.bus, server.signer, now_ms, ["n1"])
    revoked = await generation(lab)
    await until(lambda: list(lab.agents["n1"].state.spec.access.revoked_serials) == ["4242"])

    async def expired() -> bool:
        return await server.store.now_ms() > valid_before

    await until(expired)
    async with server.store.transaction() as tx:  # the next SSH write, after the certificate expired
        await ssh.sync_access(tx, server.bus, server.signer, await server.store.now_ms(), ["n1"])
    assert await generation(lab) == revoked
    spec = json.loads((await lab.admin.get_spec("n1")).spec_json)
    assert spec["access"]["revoked_serials"] == ["4242"]
