"""site.httpProxy's target rule (agent.site.proxy_rules): never a BMC, only a listed target's addresses."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.site.proxy_rules import Forbidden, allowed
from bc.protocol.pb import spec_pb2

TARGETS = [spec_pb2.SiteProxyTarget(node_id="gpu-07", addresses=["10.1.0.7", "fd00::7"], names=["gpu-07.lab"])]
BMC_HOSTS = ["bmc-07.lab", "10.9.0.7"]
BMC_ADDRS = ["10.9.0.7", "10.9.0.8"]
NETS = [ipaddress.ip_network("10.9.0.0/24")]


def check(url: str, resolved: list[str], target: str = "gpu-07") -> list[str]:
    return allowed(url, target, TARGETS, BMC_HOSTS, BMC_ADDRS, NETS, resolved)


def test_a_listed_address_or_a_name_that_resolves_only_to_them_is_allowed() -> None:
    assert check("http://10.1.0.7:8080/metrics", ["10.1.0.7"]) == ["10.1.0.7"]
    assert check("http://[fd00::7]/x", ["fd00::7"]) == ["fd00::7"]
    assert check("https://gpu-07.lab/health", ["10.1.0.7"]) == ["10.1.0.7"]


@pytest.mark.parametrize(
    ("url", "resolved", "why"),
    [
        ("http://10.1.0.7/redfish/v1/Systems", ["10.1.0.7"], "/redfish"),
        ("http://10.1.0.7/REDFISH", ["10.1.0.7"], "/redfish"),
        ("http://bmc-07.lab/", ["10.1.0.7"], "BMC this site drives"),
        ("http://10.9.0.7/", ["10.9.0.7"], "BMC this site drives"),
        ("http://gpu-07.lab/", ["10.9.0.8"], "resolves to a BMC's address"),
        ("http://10.9.0.50/", ["10.9.0.50"], "BMC networks"),
        ("http://10.1.0.8/", ["10.1.0.8"], "not an address of gpu-07"),
        ("http://elsewhere.lab/", ["10.1.0.7", "10.1.0.9"], "not gpu-07's"),
        ("http://nowhere.lab/", [], "resolves to no address"),
        ("ftp://10.1.0.7/", ["10.1.0.7"], "http or https"),
        ("http://u:p@10.1.0.7/", ["10.1.0.7"], "credentials"),
    ],
)
def test_forbidden_targets(url: str, resolved: list[str], why: str) -> None:
    with pytest.raises(Forbidden) as e:
        check(url, resolved)
    assert why in e.value.why


def test_a_node_that_is_not_a_listed_target_reaches_nothing() -> None:
    with pytest.raises(Forbidden, match="not a proxy target"):
        check("http://10.1.0.7/", ["10.1.0.7"], target="gpu-99")
    with pytest.raises(Forbidden, match="not a proxy target"):
        allowed("http://10.1.0.7/", "gpu-07", [], [], [], [], ["10.1.0.7"])


octet = st.integers(0, 255)
ipv4 = st.builds(lambda a, b, c, d: f"{a}.{b}.{c}.{d}", octet, octet, octet, octet)


@given(
    host=st.one_of(ipv4, st.sampled_from(["gpu-07.lab", "bmc-07.lab", "x.lab"])),
    resolved=st.lists(st.one_of(ipv4, st.sampled_from(["10.1.0.7", "10.9.0.7", "10.9.0.8", "fd00::7"])), max_size=4),
    path=st.sampled_from(["/", "/redfish/v1", "/metrics", "/Redfish/v1/Managers"]),
)
def test_whatever_is_allowed_is_no_bmc_and_only_the_targets_addresses(
    host: str, resolved: list[str], path: str
) -> None:
    try:
        dial = check(f"http://{host}{path}", resolved)
    except Forbidden:
        return
    assert not path.lower().startswith("/redfish")
    assert host not in BMC_HOSTS
    assert dial and set(dial) <= {"10.1.0.7", "fd00::7"}
    assert not any(ipaddress.ip_address(a) in NETS[0] for a in dial)
    assert not set(dial) & set(BMC_ADDRS)
