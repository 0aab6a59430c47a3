"""agent.instances.net.names: tap names from the spec alone, EUI-64 link-local addresses, derived MACs."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from agent.instances.net.names import eui64_link_local, nic_mac, tap_name
from bc.protocol import instance_net_rules, instance_rules

IDS = st.from_regex(instance_rules.INSTANCE_ID, fullmatch=True)


@given(IDS, st.integers(min_value=0, max_value=instance_net_rules.MAX_NICS - 1))
def test_a_tap_name_is_a_linux_interface_name_starting_with_bc(iid: str, index: int) -> None:
    name = tap_name(iid, index)
    assert len(name) <= 15 and name.startswith("bc")
    assert name.isascii() and name.isalnum()
    assert tap_name(iid, index) == name  # the rules can name it before it exists


@given(IDS, st.integers(0, 7), IDS, st.integers(0, 7))
def test_two_nics_share_a_tap_name_only_when_they_are_one(a: str, i: int, b: str, j: int) -> None:
    assert (tap_name(a, i) == tap_name(b, j)) == ((a, i) == (b, j))


def test_tap_names_are_distinct_over_many_ids() -> None:
    ids = [f"vm-{n}" for n in range(10_000)] + [f"{n:x}" for n in range(10_000)]
    names = {tap_name(i, n) for i in ids for n in range(instance_net_rules.MAX_NICS)}
    assert len(names) == len(set(ids)) * instance_net_rules.MAX_NICS


def test_a_long_id_still_fits() -> None:
    assert len(tap_name("a" * 63, 7)) == 15


def test_eui64_link_local_follows_rfc_4291() -> None:
    assert eui64_link_local("52:54:00:12:34:56") == "fe80::5054:ff:fe12:3456"
    assert eui64_link_local("00:16:3e:00:00:01") == "fe80::216:3eff:fe00:1"


@given(IDS, st.integers(min_value=0, max_value=7))
def test_a_derived_mac_is_unicast_and_passes_the_rules(iid: str, index: int) -> None:
    mac = nic_mac(iid, index, "")
    instance_net_rules.check_mac(mac, "mac")
    assert mac.startswith("52:54:") and nic_mac(iid, index, "02:00:00:00:00:01") == "02:00:00:00:00:01"
