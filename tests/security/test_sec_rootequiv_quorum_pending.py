"""An admin's root-equivalent change waits for the quorum once approvers exist; the node takes it only then.

With approvers registered, `bc spec set n1 host` with a `kernel.core_pattern`
pipe by an admin stores nothing: it opens a `spec.set` batch over the exact
section (listed by `bc approve list` and the TUI's approvals, which read
ListBatches) and the generation does not move while fewer than k approvers
signed. At the k-th signature the section is written, the generation moves
once, and the node — holding the approvers — takes the spec because it
carries the batch's signatures and the leaf's proof. In a lab with no
approvers, the admin alone is enough, as for destructive commands.
"""

from __future__ import annotations

import json

from bc.pki.batch_scope import recompute_root
from tests.integration import conftest as lab_fixtures
from tests.integration.conftest import InprocLab
from tests.integration.operators_lab import approvers, sign
from tests.integration.test_compromised_gateway import until
from tests.security.rootequiv_helpers import generation, holds_approvers, host, node

lab, store_url = lab_fixtures.lab, lab_fixtures.store_url  # the in-process lab, on each store

CORE_PIPE = host({"sysctl": {"kernel.core_pattern": "|/usr/lib/crash-handler %p"}})


async def test_a_root_equivalent_change_waits_for_k_approvals_then_applies(lab: InprocLab) -> None:
    await node(lab)
    quorum = await approvers(lab, n=3, k=2)
    await holds_approvers(lab, 3)
    gen = await generation(lab)

    info = await lab.admin.set_spec_section("n1", "host", CORE_PIPE)
    assert info.pending_batch_id and info.generation == gen
    [b] = [b for b in await lab.admin.list_batches(state="pending") if b.id == info.pending_batch_id]
    assert b.kind == "spec.set" and [leaf.node_id for leaf in b.leaves] == ["n1"]
    assert json.loads(json.loads(b.payload_json)["section_json"]) == json.loads(CORE_PIPE)
    assert recompute_root(b).hex() == b.scope_root  # what `bc approve sign` recomputes before it signs

    b = await sign(lab, b, quorum[0])
    assert b.state == "pending" and await generation(lab) == gen  # 1 of 2: nothing moved
    assert "core_pattern" not in (await lab.admin.get_spec("n1")).spec_json

    b = await sign(lab, b, quorum[1])
    assert b.state == "approved"
    assert await generation(lab) == gen + 1
    spec = json.loads((await lab.admin.get_spec("n1")).spec_json)
    assert json.loads(spec["host"]["units"][0]["settings_json"]) == {
        "kernel.core_pattern": "|/usr/lib/crash-handler %p"
    }
    # The node holds the approvers and takes the spec: the body carries the quorum's approval.
    await until(lambda: lab.agents["n1"].applied_generation == gen + 1)

    # A later, ordinary change keeps the approval with the unchanged host section: the node takes it too.
    await lab.admin.set_spec_section("n1", "telemetry", json.dumps({"export_interval_s": 30}))
    await until(lambda: lab.agents["n1"].applied_generation == gen + 2)


async def test_without_approvers_the_admin_alone_is_enough(lab: InprocLab) -> None:
    await node(lab)
    gen = await generation(lab)
    info = await lab.admin.set_spec_section("n1", "host", CORE_PIPE)
    assert not info.pending_batch_id and info.generation == gen + 1
    await until(lambda: lab.agents["n1"].applied_generation == gen + 1)
