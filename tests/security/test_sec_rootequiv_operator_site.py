"""An operator points a site at another BMC, credentials file or proxy target: refused (docs/metal.md).

A machine's `bmc_url` is where the site agent sends that BMC's credentials, even for `bmc.query` (an
operator's kind): an operator who could set it could collect the passwords. Its MACs decide which machine
the boot server hands a ramdisk join token; `credentials_file` (or `credentials_secret_ref`) is where the
site reads the passwords; `proxy_targets` is what `site.httpProxy` may reach. Each is root-equivalent
(bc.protocol.root_equiv): the operator's call is refused with the reason and nothing is stored. Cached
images and the boot server are an operator's to set.
"""

from __future__ import annotations

import json

import pytest

from agent.join import join_node
from bc.errors import Unauthenticated
from tests.integration import conftest as lab_fixtures
from tests.integration.conftest import InprocLab
from tests.integration.operators_lab import add_operator, as_operator
from tests.security.rootequiv_helpers import generation

lab, store_url = lab_fixtures.lab, lab_fixtures.store_url  # the in-process lab, on each store

MACHINE = {"name": "m1", "bmcUrl": "https://10.9.0.1", "macs": ["aa:bb:cc:dd:ee:01"]}
BASE = {"machines": [MACHINE], "credentialsFile": "/etc/bc/bmc.json"}

REFUSED = {
    "a BMC URL moved": {**BASE, "machines": [{**MACHINE, "bmcUrl": "https://collector.example"}]},
    "a machine added": {**BASE, "machines": [MACHINE, {"name": "m2", "bmcUrl": "https://10.9.0.2"}]},
    "a MAC added": {**BASE, "machines": [{**MACHINE, "macs": ["aa:bb:cc:dd:ee:01", "aa:bb:cc:dd:ee:99"]}]},
    "the credentials file": {**BASE, "credentialsFile": "/tmp/other.json"},
    "a credentials secret instead": {"machines": [MACHINE], "credentialsSecretRef": "bmc-creds"},
    "a proxy target": {**BASE, "proxyTargets": [{"nodeId": "gpu-07", "addresses": ["10.1.0.7"]}]},
}

ALLOWED = {
    "a cached image": {**BASE, "cacheImages": [{"url": "https://images.example/k", "sha256": "ab" * 32}]},
    "the boot server": {
        **BASE,
        "boot": {"interface": "eth1", "dhcpRange": "10.2.0.10,10.2.0.99", "httpAddress": "10.2.0.1:8081"},
    },
}


async def join_site(lab: InprocLab) -> None:
    tok = await lab.admin.create_token("s1", role="site")
    await join_node(lab.server.address, tok.token, lab.node_dir("s1"))


@pytest.mark.parametrize("what", sorted(REFUSED))
async def test_an_operator_cannot_redirect_a_sites_bmcs_or_proxy(lab: InprocLab, what: str) -> None:
    await join_site(lab)
    await lab.admin.set_spec_section("s1", "site", json.dumps(BASE))  # the admin's
    bob = await add_operator(lab, "bob", "operator")
    before = await lab.admin.get_spec("s1")
    with pytest.raises(Unauthenticated, match=r"root-equivalent .*needs the admin role.*operator bob"):
        await as_operator(bob, lambda c: c.set_spec_section("s1", "site", json.dumps(REFUSED[what])))
    after = await lab.admin.get_spec("s1")
    assert (after.generation, after.spec_json) == (before.generation, before.spec_json)


async def test_an_operator_may_set_a_sites_images_and_boot_server(lab: InprocLab) -> None:
    await join_site(lab)
    await lab.admin.set_spec_section("s1", "site", json.dumps(BASE))
    bob = await add_operator(lab, "bob", "operator")
    for text in ALLOWED.values():
        gen = await generation(lab, "s1")
        await as_operator(bob, lambda c, t=json.dumps(text): c.set_spec_section("s1", "site", t))
        assert await generation(lab, "s1") == gen + 1
