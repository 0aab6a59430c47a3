"""An operator writes their own SSH CA and a root principal into a node's access section: refused.

`bc spec set NODE access` with a CA the operator holds the key of and
`root@NODE` would let them log in as root. It is root-equivalent
(bc.protocol.root_equiv), so it needs the admin role; the operator's call is
refused with a sentence naming why, and nothing is stored: the generation
and the access section stay as they were. Each widening alone is refused as
well (a CA without a principal, a principal under the cluster's own CA, a
certificate taken out of the KRL, another exec-ticket key set), while an
operator's ordinary change to another section still goes through.
"""

from __future__ import annotations

import json

import pytest

from bc.errors import Unauthenticated
from tests.integration import conftest as lab_fixtures
from tests.integration.conftest import InprocLab
from tests.integration.operators_lab import add_operator, as_operator
from tests.security.rootequiv_helpers import OWN_CA, generation, node

lab, store_url = lab_fixtures.lab, lab_fixtures.store_url  # the in-process lab, on each store

WIDENINGS = {
    "own CA and root": {"ssh_ca_keys": [OWN_CA], "principals": ["root@n1"]},
    "own CA alone": {"ssh_ca_keys": [OWN_CA]},
    "a principal alone": {"principals": ["oncall@n1"]},
    "an exec-ticket key set": {"exec_ticket_jwks": '{"keys":[]}'},
}


@pytest.mark.parametrize("what", sorted(WIDENINGS))
async def test_an_operator_cannot_widen_ssh_access(lab: InprocLab, what: str) -> None:
    await node(lab)
    bob = await add_operator(lab, "bob", "operator")
    before = await lab.admin.get_spec("n1")
    section = json.dumps(WIDENINGS[what])
    with pytest.raises(Unauthenticated, match=r"root-equivalent .*needs the admin role.*operator bob has the operator"):
        await as_operator(bob, lambda c: c.set_spec_section("n1", "access", section))
    after = await lab.admin.get_spec("n1")
    assert (after.generation, after.spec_json) == (before.generation, before.spec_json)
    # An ordinary change is still the operator's.
    await as_operator(bob, lambda c: c.set_spec_section("n1", "telemetry", json.dumps({"export_interval_s": 30})))
    assert await generation(lab) == before.generation + 1


async def test_taking_a_serial_out_of_the_krl_is_refused_but_revoking_is_not(lab: InprocLab) -> None:
    await node(lab)
    bob = await add_operator(lab, "bob", "operator")
    # The admin revokes (as `bc ssh revoke` leaves it: a serial in revoked_serials).
    await lab.admin.set_spec_section("n1", "access", json.dumps({"revoked_serials": ["7", "9"]}))
    gen = await generation(lab)
    with pytest.raises(Unauthenticated, match=r"removes 9 from access\.revoked_serials"):
        await as_operator(bob, lambda c: c.set_spec_section("n1", "access", json.dumps({"revoked_serials": ["7"]})))
    assert await generation(lab) == gen
    # Revoking one more takes privilege away: the operator may.
    more = json.dumps({"revoked_serials": ["7", "9", "11"]})
    await as_operator(bob, lambda c: c.set_spec_section("n1", "access", more))
    assert await generation(lab) == gen + 1
