"""A control plane with a stolen worker key sends a root-equivalent section without the quorum: the node refuses.

The worker key signs every DesiredState, so whoever holds it can sign any
spec. Once a node holds approver keys it takes a root-equivalent change only
with the `spec.set` batch's signatures and its leaf's proof for exactly that
section (agent/spec_quorum.py). Three ways in, each refused by the node,
which keeps the spec it holds and reports `security.spec-rejected`:

* the control plane writes the spec itself (bc.control.nodes.specs.write_spec with
  the worker key), skipping `bc spec set` and its batch;
* a gateway with the stolen key rewrites a real spec on its way to the node
  and signs it again (the production gateway, its links wrapped in the
  tamperer of tests/integration/test_compromised_gateway.py);
* a real approval of another content of the same section is attached to
  the forged one (the leaf is rebuilt from the section itself).
"""

from __future__ import annotations

import json
from typing import Any

from bc.control.nodes import specs
from bc.protocol.pb import session_pb2, spec_pb2
from bc.protocol.pb.session_pb2 import GatewayMessage
from tests.integration import conftest as lab_fixtures
from tests.integration.conftest import InprocLab
from tests.integration.operators_lab import approvers, sign
from tests.integration.test_compromised_gateway import compromise, until
from tests.security.rootequiv_helpers import OWN_CA, generation, holds_approvers, host, node

lab, store_url = lab_fixtures.lab, lab_fixtures.store_url  # the in-process lab, on each store


def core_pipe(spec: spec_pb2.NodeSpec) -> None:
    spec.host.CopyFrom(
        spec_pb2.HostSection(
            units=[spec_pb2.HostUnit(name="sysctl", settings_json='{"kernel.core_pattern":"|/tmp/x"}')]
        )
    )


async def guarded_node(lab: InprocLab) -> None:
    await node(lab)
    lab.quorum = await approvers(lab, n=2, k=2)  # type: ignore[attr-defined]
    await holds_approvers(lab, 2)


async def rejected_after(lab: InprocLab, generation: int) -> dict[str, Any]:
    ev = await lab.wait_event(
        "security.spec-rejected", lambda ev, d: ev.subject == "n1" and d["generation"] == generation
    )
    return dict(json.loads(ev.data_json))


async def test_a_spec_the_control_plane_signs_without_the_quorum_is_refused(lab: InprocLab) -> None:
    await guarded_node(lab)
    held = lab.agents["n1"].applied_generation
    server = lab.server
    async with server.store.transaction() as tx:
        w = await specs.write_spec(tx, server.bus, server.signer, "n1", core_pipe, await server.store.now_ms())
    sec = await rejected_after(lab, w.generation)
    assert "ROOT_EQUIVALENT" in sec["reason"] and "core_pattern" in sec["reason"]
    assert lab.agents["n1"].applied_generation == held
    assert "core_pattern" not in lab.agents["n1"].state.spec.host.SerializeToString().decode(errors="replace")


async def test_a_gateway_with_the_worker_key_cannot_add_its_ssh_ca_and_root(lab: InprocLab) -> None:
    t = compromise(lab)
    await guarded_node(lab)
    held = lab.agents["n1"].applied_generation
    signer = lab.server.signer

    def forge(msg: GatewayMessage) -> GatewayMessage:
        if msg.HasField("desired_state"):
            body = session_pb2.DesiredStateBody.FromString(msg.desired_state.envelope.body)
            body.full.access.ssh_ca_keys.append(OWN_CA)
            body.full.access.principals.append("root@n1")
            forged = body.SerializeToString(deterministic=True)
            msg.desired_state.envelope.body = forged
            msg.desired_state.envelope.signature = signer.sign_spec(forged).signature  # a valid worker signature
        return msg

    t.outbound = forge
    await lab.admin.set_spec_section("n1", "telemetry", json.dumps({"export_interval_s": 30}))
    gen = await generation(lab)
    sec = await rejected_after(lab, gen)
    assert "ROOT_EQUIVALENT" in sec["reason"] and "access" in sec["reason"]
    assert lab.agents["n1"].applied_generation == held
    assert list(lab.agents["n1"].state.spec.access.ssh_ca_keys) == []


async def test_an_approval_of_another_content_does_not_carry_over(lab: InprocLab) -> None:
    await guarded_node(lab)
    # A real, approved change: core dumps piped to the crash handler.
    info = await lab.admin.set_spec_section("n1", "host", host({"sysctl": {"kernel.core_pattern": "|/usr/lib/ch"}}))
    [b] = [b for b in await lab.admin.list_batches(state="pending") if b.id == info.pending_batch_id]
    for a in lab.quorum:  # type: ignore[attr-defined]
        b = await sign(lab, b, a)
    assert b.state == "approved"
    approved = await generation(lab)
    await until(lambda: lab.agents["n1"].applied_generation == approved)
    # The control plane now swaps the handler for its own and attaches the approval of the first one.
    held = lab.agents["n1"].state.stored
    assert held is not None
    [stolen] = session_pb2.DesiredStateBody.FromString(held.body).section_approvals
    server = lab.server
    async with server.store.transaction() as tx:
        now_ms = await server.store.now_ms()
        w = await specs.write_spec(tx, server.bus, server.signer, "n1", core_pipe, now_ms, approvals=[stolen])
    sec = await rejected_after(lab, w.generation)
    assert "ROOT_EQUIVALENT" in sec["reason"] and "proof does not put" in sec["reason"]
    assert lab.agents["n1"].applied_generation == approved
