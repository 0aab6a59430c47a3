"""An approved root-equivalent change is never lost between its approval and its write, nor written twice.

The k-th `bc approve sign` turns a `spec.set` batch approved; writing the
section is a second transaction. Here the process records the approval and
dies before the write (the same state a store error in the write leaves).
Before the fix nothing ever wrote it: the batch stayed approved and the
generation never moved. Now the command sweeper's next pass (and so the next
start) writes it, the generation moves exactly once, and the node takes it
with the quorum's approval; further passes and a late ApproveBatch write
nothing more.
"""

from __future__ import annotations

import json

from tests.integration import conftest as lab_fixtures
from tests.integration.conftest import InprocLab
from tests.integration.operators_lab import sign
from tests.integration.test_compromised_gateway import until
from tests.security.gaps29_helpers import CORE_PIPE, guarded, record_approval
from tests.security.rootequiv_helpers import generation

lab, store_url = lab_fixtures.lab, lab_fixtures.store_url  # the in-process lab, on each store


async def test_an_approval_recorded_before_a_crash_is_written_once(lab: InprocLab) -> None:
    quorum = await guarded(lab)
    gen = await generation(lab)
    info = await lab.admin.set_spec_section("n1", "host", CORE_PIPE)
    b = await lab.admin.get_batch(info.pending_batch_id)
    b = await sign(lab, b, quorum[0])
    assert b.state == "pending"

    await record_approval(lab, b, quorum[1])  # the k-th signature; the write never happens in this call
    assert (await lab.admin.get_batch(b.id)).state == "approved"

    async def written() -> bool:
        return await generation(lab) == gen + 1

    await until(written)  # the sweeper's next pass (every 5 s) writes it
    await until(lambda: lab.agents["n1"].applied_generation == gen + 1)  # the node takes it: the quorum's
    assert "core_pattern" in lab.agents["n1"].state.spec.host.units[0].settings_json

    # Exactly once: more passes, and the ApproveBatch path reaching the batch late, write nothing more.
    sweeper = lab.server.parts.sweeper
    assert sweeper is not None
    await sweeper.sweep_once()
    await sweeper.sweep_once()
    assert await generation(lab) == gen + 1
    applied = [
        e
        for e in await lab.admin.list_events(type_prefix="spec.root-change-applied")
        if json.loads(e.data_json)["batch_id"] == b.id
    ]
    assert len(applied) == 1
    assert (await lab.admin.get_batch(b.id)).resolution == "applied"
