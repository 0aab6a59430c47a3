"""The site section's rules (bc.protocol.site_rules), as the control plane refuses a section before storing it."""

from __future__ import annotations

import pytest

from bc.protocol import root_equiv, secret_refs, spec_validation
from bc.protocol.canonical import SpecError
from bc.protocol.pb import spec_pb2


def section(**kw: object) -> spec_pb2.SiteSection:
    base: dict[str, object] = {
        "machines": [spec_pb2.SiteMachine(name="m1", bmc_url="https://10.9.0.1", macs=["aa:bb:cc:dd:ee:01"])],
        "credentials_file": "/etc/bc/bmc.json",
        "boot": spec_pb2.SiteBootServer(
            interface="eth1", dhcp_range="10.2.0.10,10.2.0.99", http_address="10.2.0.1:8081"
        ),
        "proxy_targets": [spec_pb2.SiteProxyTarget(node_id="m1", addresses=["10.2.0.50"])],
    }
    base.update(kw)
    return spec_pb2.SiteSection(**base)  # type: ignore[arg-type]


def test_a_good_section_is_stored() -> None:
    spec_validation.check_section("site", section())


@pytest.mark.parametrize(
    ("kw", "words"),
    [
        ({"machines": [spec_pb2.SiteMachine(name="m 1", bmc_url="https://b")]}, "machines[0].name"),
        ({"machines": [spec_pb2.SiteMachine(name="m1", bmc_url="https://admin:pw@b")]}, "must not carry credentials"),
        ({"machines": [spec_pb2.SiteMachine(name="m1", bmc_url="https://b/redfish/v1")]}, "root URL"),
        ({"machines": [spec_pb2.SiteMachine(name="m1", bmc_url="https://b", macs=["AA:BB:CC:DD:EE:01"])]}, "not a MAC"),
        ({"credentials_file": "bmc.json"}, "absolute path"),
        (
            {
                "boot": spec_pb2.SiteBootServer(
                    interface="eth1", dhcp_range="10.2.0.99,10.2.0.10", http_address="10.2.0.1:1"
                )
            },
            "dhcp_range",
        ),
        (
            {"boot": spec_pb2.SiteBootServer(interface="eth1", dhcp_range="10.2.0.1,10.2.0.9", http_address="host:80")},
            "http_address",
        ),
        ({"proxy_targets": [spec_pb2.SiteProxyTarget(node_id="m1", addresses=["10.9.0.1"])]}, "never reaches a BMC"),
        ({"proxy_targets": [spec_pb2.SiteProxyTarget(node_id="m1", addresses=["gpu.lab"])]}, "not an IP address"),
        (
            {"cache_images": [spec_pb2.CacheImage(url="https://10.9.0.1/redfish/v1", sha256="ab" * 32)]},
            "never from a BMC",
        ),
    ],
)
def test_a_bad_section_is_refused_naming_the_field(kw: dict[str, object], words: str) -> None:
    with pytest.raises(SpecError) as e:
        spec_validation.check_section("site", section(**kw))
    assert words in str(e.value)
    assert str(e.value).startswith("the site section's ")


def test_two_machines_may_not_share_a_name_or_a_mac() -> None:
    m = spec_pb2.SiteMachine(name="m1", bmc_url="https://b1", macs=["aa:bb:cc:dd:ee:01"])
    with pytest.raises(SpecError, match="listed twice"):
        spec_validation.check_section("site", section(machines=[m, m], proxy_targets=[]))
    m2 = spec_pb2.SiteMachine(name="m2", bmc_url="https://b2", macs=["aa:bb:cc:dd:ee:01"])
    with pytest.raises(SpecError, match="also 'm1'"):
        spec_validation.check_section("site", section(machines=[m, m2], proxy_targets=[]))


def test_the_credentials_come_from_a_file_or_a_secret_never_both() -> None:
    spec_validation.check_section("site", section(credentials_file="", credentials_secret_ref="bmc-creds"))
    spec_validation.check_section("site", section(credentials_file=""))  # neither: the kinds fail bmc-credentials
    with pytest.raises(SpecError) as e:
        spec_validation.check_section("site", section(credentials_secret_ref="bmc-creds"))
    assert str(e.value) == (
        "the site section's credentials_secret_ref and credentials_file are both set:"
        " the BMC credentials come from one of them"
    )
    with pytest.raises(SpecError, match=r"credentials_secret_ref 'BMC creds' is not a secret name"):
        spec_validation.check_section("site", section(credentials_file="", credentials_secret_ref="BMC creds"))


def test_a_credentials_secret_is_named_by_the_site_section_and_root_equivalent() -> None:
    spec = spec_pb2.NodeSpec(site=section(credentials_file="", credentials_secret_ref="bmc-creds"))
    assert [(r.where, r.name) for r in secret_refs.refs(spec)] == [("site", "bmc-creds")]
    assert secret_refs.names(spec, "site") == {"bmc-creds"} and secret_refs.names(spec, "telemetry") == set()
    before = spec_pb2.SiteSection(credentials_secret_ref="old-creds")
    assert root_equiv.changes("site", before, spec_pb2.SiteSection(credentials_secret_ref="bmc-creds"))
