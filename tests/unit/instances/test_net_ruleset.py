"""agent.instances.net.ruleset: the nftables text built from the section, checked by real nft (`nft -c`, then
loaded in a private network namespace and listed: the counts the guard compares are the ones nft holds)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.instances.net import nft
from agent.instances.net.names import tap_name
from agent.instances.net.ruleset import ARP_TABLE, BRIDGE_TABLE, INET_TABLE, HostAddresses, TapRules, build, taps_of
from bc.protocol.pb import spec_pb2
from tests.netns import NetNs, private_netns

HOST = HostAddresses(("10.0.0.1",), ("fd00::1", "fe80::1"))
A = TapRules("a", "bc1111111111111", "52:54:00:00:00:0a", ("10.0.0.10/24", "fd00::a/64"))
B = TapRules("b", "bc2222222222222", "52:54:00:00:00:0b", ("10.0.0.11/24",), "PRIVATE", ssh_from_host_only=True)
C = TapRules("c", "bc3333333333333", "52:54:00:00:00:0c", ("10.0.1.12/24",), "NONE")
OPEN = TapRules("d", "bc4444444444444")


@pytest.fixture(scope="module")
def ns(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NetNs]:
    with private_netns(tmp_path_factory.mktemp("ns")) as n:
        yield n


def rules_of(text: str, table: tuple[str, str], chain: str = "") -> list[str]:
    """The rules of one table (or of one of its chains), as nft's input holds them."""
    head = f"table {table[0]} {table[1]} {{"
    body = text[text.index(head) :]
    body = body[: body.index("\n}\n")]
    if chain:
        body = body[body.index(f"\tchain {chain} {{") :]
        body = body[: body.index("\n\t}")]
    return [ln.strip() for ln in body.splitlines() if ln.startswith("\t\t") and not ln.strip().startswith("type ")]


def test_every_tap_drops_dhcp_server_replies_router_adverts_redirects_and_the_hosts_addresses() -> None:
    text = build([OPEN], HOST).text
    rules = rules_of(text, BRIDGE_TABLE)
    for rule in (
        'iifname "bc*" udp sport { 67, 547 } drop',
        'iifname "bc*" icmpv6 type { nd-router-advert, nd-redirect } drop',
        'iifname "bc*" icmp type redirect drop',
        'iifname "bc*" ip saddr { 10.0.0.1 } drop',
        'iifname "bc*" arp saddr ip { 10.0.0.1 } drop',
        'iifname "bc*" ip6 saddr { fd00::1, fe80::1 } drop',
        'iifname "bc*" ether type { vlan, 8021ad } drop',
    ):
        assert rule in rules
    assert not any("bc4444444444444" in r for r in rules)  # no MAC, no addresses: nothing of its own


def test_a_nic_with_mac_and_addresses_is_anti_spoofed_in_its_own_chain() -> None:
    text = build([A, OPEN], HOST).text
    tap = "bc1111111111111"
    assert rules_of(text, BRIDGE_TABLE, f"pre_{tap}") == [
        "ether saddr != 52:54:00:00:00:0a drop",
        "ether type != { ip, ip6, arp } drop",
        "ip saddr != { 10.0.0.10, 0.0.0.0 } drop",
        "ip6 saddr != { fd00::a, fe80::5054:ff:fe00:a, :: } drop",
        "arp saddr ip != { 10.0.0.10 } drop",
        "arp saddr ether != 52:54:00:00:00:0a drop",
        "icmpv6 type nd-neighbor-advert @th,64,128 != { 0xfd00000000000000000000000000000a,"
        " 0xfe80000000000000505400fffe00000a } drop",
    ]  # EGRESS adds nothing
    assert f'iifname vmap {{ "{tap}" : jump pre_{tap} }}' in rules_of(text, BRIDGE_TABLE, "prerouting")
    assert "bc4444444444444" not in text.split("table inet")[0].replace('"bc*"', "")  # no MAC, no addresses


def test_each_guarded_address_is_bound_to_its_tap() -> None:
    pre = rules_of(build([A, B], HOST).text, BRIDGE_TABLE, "prerouting")
    a, b = '"bc1111111111111"', '"bc2222222222222"'
    assert (
        f"ip saddr {{ 10.0.0.10, 10.0.0.11 }} ip saddr . iifname != {{ 10.0.0.10 . {a}, 10.0.0.11 . {b} }} drop" in pre
    )
    assert (
        f"arp saddr ip {{ 10.0.0.10, 10.0.0.11 }} arp saddr ip . iifname != {{ 10.0.0.10 . {a}, 10.0.0.11 . {b} }} drop"
        in pre
    )
    v6 = [r for r in pre if r.startswith("ip6 saddr { fd00::a")]
    assert v6 and f"fe80::5054:ff:fe00:b . {b}" in v6[0] and f"fd00::a . {a}" in v6[0]
    assert any(r.startswith("icmpv6 type nd-neighbor-advert @th,64,128 {") and ". iifname !=" in r for r in pre)


def test_private_keeps_a_nic_to_its_subnets_and_the_host() -> None:
    text = build([B], HOST).text
    tap = "bc2222222222222"
    pre = rules_of(text, BRIDGE_TABLE, f"pre_{tap}")
    assert "ip daddr != { 10.0.0.0/24, 10.0.0.1, 255.255.255.255 } drop" in pre
    assert "ip6 daddr != { fd00::1, fe80::1, fe80::/10, ff02::/16 } drop" in pre
    assert rules_of(text, BRIDGE_TABLE, f"into_{tap}") == [
        "ip saddr != { 10.0.0.0/24 } drop",
        "ip6 saddr != { fe80::/10 } drop",
    ]
    assert rules_of(text, BRIDGE_TABLE, f"out_{tap}")[0] == "ip saddr != { 10.0.0.0/24, 10.0.0.1 } drop"
    assert f'oifname vmap {{ "{tap}" : jump into_{tap} }}' in rules_of(text, BRIDGE_TABLE, "forward")


def test_none_keeps_a_nic_to_the_host() -> None:
    text = build([C], HOST).text
    tap = "bc3333333333333"
    assert "ip daddr != { 10.0.0.1, 255.255.255.255 } drop" in rules_of(text, BRIDGE_TABLE, f"pre_{tap}")
    forward = rules_of(text, BRIDGE_TABLE, "forward")
    assert f'iifname {{ "{tap}" }} drop' in forward and f'oifname {{ "{tap}" }} drop' in forward
    assert rules_of(text, BRIDGE_TABLE, f"out_{tap}") == [
        "ip saddr != { 10.0.0.1 } drop",
        "ip6 saddr != { fd00::1, fe80::1 } drop",
    ]


def test_ssh_from_the_host_only_sits_ahead_of_the_rest() -> None:
    text = build([A, B, C], HOST).text
    tap = '"bc2222222222222"'
    assert rules_of(text, BRIDGE_TABLE, "forward")[0] == f"oifname {{ {tap} }} tcp dport 22 drop"
    assert rules_of(text, BRIDGE_TABLE, "output")[:2] == [
        f"oifname {{ {tap} }} ip saddr != {{ 10.0.0.1 }} tcp dport 22 drop",
        f"oifname {{ {tap} }} ip6 saddr != {{ fd00::1, fe80::1 }} tcp dport 22 drop",
    ]
    # a family without a host address: tcp/22 dropped outright
    no_v6 = rules_of(build([B], HostAddresses(("10.0.0.1",))).text, BRIDGE_TABLE, "output")
    assert f"oifname {{ {tap} }} ether type ip6 tcp dport 22 drop" in no_v6


def test_the_backstops_drop_taps_off_their_bridge() -> None:
    text = build([], HostAddresses()).text
    assert rules_of(text, INET_TABLE) == [
        'iifname "bc*" drop',
        'iifname "bc*" drop',
        'oifname "bc*" drop',
        'oifname "bc*" drop',
    ]
    assert rules_of(text, ARP_TABLE) == ['iifname "bc*" drop', 'oifname "bc*" drop']


def test_each_table_is_replaced_in_one_transaction() -> None:
    text = build([A], HOST).text
    for family, name in (BRIDGE_TABLE, INET_TABLE, ARP_TABLE):
        assert f"table {family} {name}\ndelete table {family} {name}\ntable {family} {name} {{" in text


def test_taps_of_names_each_nic_by_its_tap() -> None:
    inst = spec_pb2.Instance(
        id="web-1",
        network_policy="PRIVATE",
        nics=[spec_pb2.InstanceNic(bridge="br0", mac="52:54:00:00:00:01", addresses=["10.0.0.5/24"])] * 2,
    )
    got = taps_of([inst])
    assert [t.tap for t in got] == [tap_name("web-1", 0), tap_name("web-1", 1)]
    assert got[0].policy == "PRIVATE" and got[0].addresses == ("10.0.0.5/24",)


def test_the_counts_are_what_nft_holds_once_loaded(ns: NetNs) -> None:
    for taps, host in (([A, B, C, OPEN], HOST), ([], HostAddresses()), ([B, C], HostAddresses(("10.0.0.1",)))):
        ruleset = build(taps, host)
        ns.run("nft", "-f", "-", stdin=ruleset.text)
        for family, name in (BRIDGE_TABLE, INET_TABLE, ARP_TABLE):
            listed = ns.run("nft", "-j", "list", "table", family, name).stdout
            assert listed.count('{"rule":') == ruleset.counts[(family, name)], (family, name)
    ns.run("nft", "-f", "-", stdin=build([A], HOST).text)  # loading again replaces: no stale rules
    assert "bc2222222222222" not in ns.run("nft", "list", "ruleset").stdout


MACS = st.tuples(*[st.integers(0, 255)] * 5).map(lambda t: ":".join(f"{b:02x}" for b in (0x52, *t)))
V4 = st.tuples(st.integers(1, 254), st.integers(1, 254)).map(lambda t: f"10.{t[0]}.{t[1]}.7/16")
V6 = st.integers(1, 2**16 - 1).map(lambda n: f"fd00:{n:x}::7/64")
NICS = st.builds(
    lambda i, mac, addrs, pol, ssh: TapRules(f"i{i}", tap_name(f"i{i}", 0), mac, tuple(addrs), pol, ssh),
    st.integers(0, 10_000),
    MACS | st.just(""),
    st.lists(V4 | V6, max_size=3, unique=True),
    st.sampled_from(["EGRESS", "PRIVATE", "NONE"]),
    st.booleans(),
).filter(lambda t: t.policy == "EGRESS" or (t.mac and t.addresses))
HOSTS = st.builds(
    HostAddresses,
    st.lists(st.just("10.0.0.1"), max_size=1).map(tuple),
    st.lists(st.sampled_from(["fd00::1", "fe80::1"]), max_size=2, unique=True).map(tuple),
)


@settings(max_examples=25, deadline=None)
@given(st.lists(NICS, max_size=4, unique_by=lambda t: t.tap), HOSTS)
def test_nft_accepts_every_ruleset_the_builder_makes(taps: list[TapRules], host: HostAddresses) -> None:
    # Check mode (-c): the kernel validates the transaction and commits nothing; in a private namespace anyway.
    done = subprocess.run(
        ["unshare", "-n", "nft", "-c", "-f", "-"], input=build(taps, host).text, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr


@pytest.mark.wall_clock  # a real nft process
async def test_the_loader_says_what_nft_refused(tmp_path: Path) -> None:
    with pytest.raises(nft.NftError, match=r"^nft refused the rules: .*Error: syntax error"):
        await nft.load("table bridge bc_instances {\n\tchain x { nonsense }\n}\n", check=True, nft="nft")
    with pytest.raises(nft.NftError, match="cannot run"):
        await nft.load("", nft=str(tmp_path / "no-nft"))
