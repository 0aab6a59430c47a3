"""bc.protocol.instance_net_rules: an instance's NICs, network policy and SSH-from-host, refused in one sentence
naming the field (through the server's check and the node's)."""

from __future__ import annotations

import ipaddress

import pytest
from google.protobuf import json_format
from hypothesis import given
from hypothesis import strategies as st

from bc.protocol import instance_net_rules as net
from bc.protocol import instance_rules as rules
from bc.protocol.canonical import SpecError
from bc.protocol.pb import spec_pb2
from bc.protocol.spec_validation import check_section

GOOD = {"id": "vm-1", "runtime": "qemu", "vcpus": 1, "memory_mib": 512, "kernel": "vmlinuz"}
NIC = {"bridge": "br0", "mac": "52:54:00:00:00:01", "addresses": ["10.0.0.5/24", "fd00::5/64"]}


def section(*instances: dict[str, object]) -> spec_pb2.InstancesSection:
    return json_format.ParseDict({"instances": list(instances)}, spec_pb2.InstancesSection())


def one(**changes: object) -> spec_pb2.InstancesSection:
    return section({**GOOD, **changes})


@pytest.mark.parametrize("policy", ["", "EGRESS", "PRIVATE", "NONE"])
def test_every_policy_with_a_mac_and_addresses_passes(policy: str) -> None:
    rules.check_section(one(networkPolicy=policy, sshFromHostOnly=True, nics=[NIC]))


def test_egress_takes_a_nic_without_mac_or_addresses() -> None:
    rules.check_section(one(nics=[{"bridge": "virbr0"}]))


def test_none_and_private_without_nics_are_fine() -> None:
    rules.check_section(one(networkPolicy="NONE"))


@pytest.mark.parametrize(
    "changes, field, words",
    [
        ({"networkPolicy": "OPEN"}, "network_policy", "must be one of EGRESS, PRIVATE, NONE"),
        ({"nics": [{**NIC, "bridge": "bcbr"}]}, "nics[0].bridge", "starts with 'bc', which every instance tap"),
        ({"nics": [{**NIC, "bridge": ""}]}, "nics[0].bridge", "is not an interface name"),
        ({"nics": [{**NIC, "bridge": "a" * 16}]}, "nics[0].bridge", "is not an interface name"),
        ({"nics": [{**NIC, "bridge": "br/0"}]}, "nics[0].bridge", "is not an interface name"),
        ({"nics": [{**NIC, "mac": "52:54:00:00:00"}]}, "nics[0].mac", "is not a MAC address"),
        ({"nics": [{**NIC, "mac": "52-54-00-00-00-01"}]}, "nics[0].mac", "is not a MAC address"),
        ({"nics": [{**NIC, "mac": "01:00:5e:00:00:01"}]}, "nics[0].mac", "is a multicast address"),
        ({"nics": [{**NIC, "mac": "ff:ff:ff:ff:ff:ff"}]}, "nics[0].mac", "is a multicast address"),
        ({"nics": [{**NIC, "mac": "00:00:00:00:00:00"}]}, "nics[0].mac", "is all zeros"),
        ({"nics": [{**NIC, "addresses": ["10.0.0.5"]}]}, "nics[0].addresses[0]", "has no prefix length"),
        ({"nics": [{**NIC, "addresses": ["10.0.0.5/33"]}]}, "nics[0].addresses[0]", "is not an address with"),
        ({"nics": [{**NIC, "addresses": ["10.0.0.0/24"]}]}, "nics[0].addresses[0]", "network's own address"),
        ({"nics": [{**NIC, "addresses": ["10.0.0.255/24"]}]}, "nics[0].addresses[0]", "broadcast address"),
        ({"nics": [{**NIC, "addresses": ["224.0.0.1/4"]}]}, "nics[0].addresses[0]", "is not a unicast address"),
        ({"nics": [{**NIC, "addresses": ["fe80::1/64"]}]}, "nics[0].addresses[0]", "is not a unicast address"),
        ({"nics": [{**NIC, "addresses": ["127.0.0.2/8"]}]}, "nics[0].addresses[0]", "is not a unicast address"),
        ({"nics": [{**NIC, "addresses": ["10.0.0.5/24", "10.0.0.5/16"]}]}, "nics[0].addresses[1]", "appears twice"),
        ({"nics": [NIC] * 9}, "nics", "more than 8"),
        (
            {"networkPolicy": "PRIVATE", "nics": [{"bridge": "br0", "addresses": ["10.0.0.5/24"]}]},
            "nics[0]",
            "has no MAC",
        ),
        ({"networkPolicy": "NONE", "nics": [NIC, {**NIC, "addresses": []}]}, "nics[1]", "has no addresses"),
    ],
)
def test_a_bad_network_field_is_refused_in_one_sentence(changes: dict[str, object], field: str, words: str) -> None:
    with pytest.raises(SpecError) as e:
        check_section("instances", one(**changes))
    message = str(e.value)
    assert message.startswith(f"the instances section's instances[0].{field} "), message
    assert words in message and "\n" not in message


def test_a_policy_that_cannot_be_expressed_says_so() -> None:
    with pytest.raises(rules.InstanceRuleError) as e:
        rules.check_instance(
            spec_pb2.Instance(**GOOD, network_policy="PRIVATE", nics=[spec_pb2.InstanceNic(bridge="br0")])
        )
    assert "a policy that cannot be expressed" in str(e.value)
    assert net.is_network_field(e.value.field)


def test_an_address_or_mac_belongs_to_one_nic_of_the_section() -> None:
    with pytest.raises(
        rules.InstanceRuleError, match=r"instances\[1\]\.nics\[0\]\.addresses\[0\] 10.0.0.5 is instance vm-1's too"
    ):
        rules.check_section(
            section({**GOOD, "nics": [NIC]}, {**GOOD, "id": "vm-2", "nics": [{**NIC, "mac": "52:54:00:00:00:02"}]})
        )
    with pytest.raises(
        rules.InstanceRuleError, match=r"instances\[1\]\.nics\[0\]\.mac 52:54:00:00:00:01 is instance vm-1's too"
    ):
        rules.check_section(
            section({**GOOD, "nics": [NIC]}, {**GOOD, "id": "vm-2", "nics": [{"bridge": "br0", "mac": NIC["mac"]}]})
        )


def test_network_fields_are_told_apart() -> None:
    for field in (
        "instances[0].nics",
        "instance.nics[1].mac",
        "instances[2].network_policy",
        "instance.ssh_from_host_only",
    ):
        assert net.is_network_field(field), field
    for field in ("instance.kernel", "instances[0].id", "instance.gpus"):
        assert not net.is_network_field(field), field


@given(st.binary(min_size=6, max_size=6))
def test_a_mac_passes_exactly_when_it_is_unicast_and_not_zero(octets: bytes) -> None:
    mac = ":".join(f"{b:02x}" for b in octets)
    try:
        net.check_mac(mac, "mac")
        passed = True
    except net.NetRuleError:
        passed = False
    assert passed == (not octets[0] & 1 and octets != bytes(6))


@given(st.ip_addresses(), st.integers(min_value=0, max_value=128))
def test_an_accepted_address_is_a_host_of_its_own_network(
    ip: ipaddress.IPv4Address | ipaddress.IPv6Address, prefix: int
) -> None:
    if prefix > ip.max_prefixlen:
        return
    text = f"{ip}/{prefix}"
    try:
        iface = net.parse_address(text, "a")
    except net.NetRuleError as e:
        assert "\n" not in e.why
        return
    assert not (iface.ip.is_multicast or iface.ip.is_loopback or iface.ip.is_link_local or iface.ip.is_unspecified)
    assert iface.network.num_addresses <= 2 or iface.ip != iface.network.network_address
