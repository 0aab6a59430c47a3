"""A stolen worker key cannot give a freshly joined node root through its first spec.

Once approvers exist, a node takes a root-equivalent change only with the
quorum's signatures and proof (agent/spec_quorum.py). Its first spec after
the join had nothing to compare with and was taken unchecked: whoever holds
the worker key signs a spec for a node that just joined — its own SSH CA, a
`root` principal, a `kernel.core_pattern` pipe — and the node applied it
before anything else. Now the first spec is checked against the node's
baseline: empty but for the install's SSH CA keys, which the join answer
names under the CA key's own signature. The forged spec is refused
(`security.spec-rejected`), nothing is applied; an honest first spec, which
carries the install's SSH CA, is taken as before.
"""

from __future__ import annotations

import json
from typing import Any

from bc.control.nodes import specs
from bc.protocol.pb import spec_pb2
from tests.integration import conftest as lab_fixtures
from tests.integration.conftest import InprocLab
from tests.integration.operators_lab import approvers
from tests.integration.test_compromised_gateway import until
from tests.security.rootequiv_helpers import OWN_CA, generation, holds_approvers, node

lab, store_url = lab_fixtures.lab, lab_fixtures.store_url  # the in-process lab, on each store


def root_for_the_thief(spec: spec_pb2.NodeSpec) -> None:
    spec.access.ssh_ca_keys.append(OWN_CA)
    spec.access.principals.append("root@n2")
    spec.host.units.add(name="sysctl", settings_json='{"kernel.core_pattern":"|/tmp/x"}')


async def guarded_install(lab: InprocLab) -> str:
    """The install's SSH CA, then approvers (the order `bc ssh ca init` requires); n1 holds them."""
    ca = await lab.admin.ssh_ca_init()
    await node(lab, "n1")
    await approvers(lab, n=2, k=2)
    await holds_approvers(lab, 2, "n1")
    return str(ca.public_key)


async def test_a_forged_first_spec_is_refused(lab: InprocLab) -> None:
    await guarded_install(lab)
    await lab.join("n2")
    server = lab.server
    async with server.store.transaction() as tx:  # the worker key signs; no batch, no approval
        w = await specs.write_spec(tx, server.bus, server.signer, "n2", root_for_the_thief, await server.store.now_ms())
    agent = await lab.start_node("n2")
    ev = await lab.wait_event(
        "security.spec-rejected", lambda ev, d: ev.subject == "n2" and d["generation"] == w.generation
    )
    sec: dict[str, Any] = json.loads(ev.data_json)
    assert "ROOT_EQUIVALENT" in sec["reason"] and "first spec this node takes" in sec["reason"]
    assert agent.applied_generation == 0
    assert list(agent.state.spec.access.ssh_ca_keys) == [] and not agent.state.spec.host.units


async def test_an_honest_first_spec_with_the_install_ssh_ca_is_taken(lab: InprocLab) -> None:
    ca_key = await guarded_install(lab)
    await node(lab, "n2")
    gen = await generation(lab, "n2")
    await until(lambda: lab.agents["n2"].applied_generation == gen)
    assert [k.split()[:2] for k in lab.agents["n2"].state.spec.access.ssh_ca_keys] == [ca_key.split()[:2]]
