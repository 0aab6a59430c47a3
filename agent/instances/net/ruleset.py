"""The host's nftables ruleset for every instance's taps, built from the section. Pure: text out, no I/O.

Three tables, replaced together by one `nft -f` transaction (agent.instances.net.nft), each as
`table X` / `delete table X` / `table X { … }` so the old one goes and the new one comes atomically:

* `bridge bc_instances`, on every bridge port named `bc*` (the taps, agent.instances.net.names):
  - **every tap**: VLAN-tagged frames (which would pass every L3 rule), DHCP server replies (udp sport
    67, 547), router advertisements and redirects (ICMPv6 and ICMP) are dropped, and so is anything that
    sends from, or claims in ARP or a neighbour advert, one of the host's own addresses on the instances'
    bridges;
  - **every NIC with a MAC and addresses** is anti-spoofed: frames carry its MAC, only IPv4, IPv6 and ARP
    go out, IPv4 comes from its addresses or `0.0.0.0` (DHCP), IPv6 from its addresses, `::` or its EUI-64
    link-local address (guests that use stable-privacy link-local addresses lose neighbour discovery), ARP
    and neighbour adverts claim only those; and each of those addresses is bound to its tap: no other
    port may send from it or claim it;
  - `PRIVATE`: the NIC exchanges IP only with its subnets and the host (plus broadcast and link-local
    multicast for DHCP and neighbour discovery); `NONE`: only with the host; `EGRESS` adds nothing;
  - `ssh_from_host_only`: tcp/22 into the tap from another bridge port is dropped, and tcp/22 the host
    sends into it is dropped unless it comes from one of the host's own addresses on the instances'
    bridges (a family without one: dropped outright).
  The rules every tap shares and the address bindings (one rule per kind, over a set of (address, tap)
  pairs) sit in the hook chains; a NIC's own rules sit in its own chains (`pre_<tap>`, `into_<tap>`,
  `out_<tap>`) reached through one verdict map per hook, so a frame meets its own tap's rules only.
* `inet bc_taps` and `arp bc_taps`, backstops: a tap on its bridge reaches the IP and ARP hooks as the
  bridge, so only a tap that is off its bridge (which the bridge table cannot see) is dropped there.

`Ruleset.counts` is the number of rules each table holds once loaded: the guard (agent.instances.net.guard)
lists the tables and compares.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from agent.instances.net.names import eui64_link_local, tap_name
from bc.protocol import instance_net_rules as net_rules
from bc.protocol.pb import spec_pb2

BRIDGE_TABLE = ("bridge", "bc_instances")
INET_TABLE = ("inet", "bc_taps")
ARP_TABLE = ("arp", "bc_taps")
TABLES = (BRIDGE_TABLE, INET_TABLE, ARP_TABLE)
TAPS = f'"{net_rules.TAP_PREFIX}*"'

_BROADCAST4 = "255.255.255.255"
_LINK_LOCAL6 = "fe80::/10"
_LINK_MULTICAST6 = "ff02::/16"


@dataclass(frozen=True)
class TapRules:
    """One NIC as the rules see it: its tap, its MAC and addresses ("" / () when the spec gives none), and its
    instance's policy."""

    instance_id: str
    tap: str
    mac: str = ""
    addresses: tuple[str, ...] = ()
    policy: str = net_rules.EGRESS
    ssh_from_host_only: bool = False

    @property
    def anti_spoofed(self) -> bool:
        return bool(self.mac and self.addresses)


@dataclass(frozen=True)
class HostAddresses:
    """The host's own addresses on the bridges the instances attach to."""

    v4: tuple[str, ...] = ()
    v6: tuple[str, ...] = ()


@dataclass(frozen=True)
class Ruleset:
    text: str
    counts: dict[tuple[str, str], int] = field(default_factory=dict)


def taps_of(instances: Iterable[spec_pb2.Instance]) -> list[TapRules]:
    """Every NIC of these (checked) instances, under its tap name."""
    return [
        TapRules(
            inst.id,
            tap_name(inst.id, i),
            nic.mac,
            tuple(nic.addresses),
            net_rules.policy(inst),
            inst.ssh_from_host_only,
        )
        for inst in instances
        for i, nic in enumerate(inst.nics)
    ]


def _set(items: Iterable[str]) -> str:
    return "{ " + ", ".join(items) + " }"


def _not_in(family: str, expr: str, items: Sequence[str]) -> str:
    """`expr != { items }` for one L3 family; with no items every packet of that family matches."""
    return f"{expr} != {_set(items)}" if items else f"ether type {family}"


def _ips(addresses: Iterable[str]) -> tuple[list[str], list[str]]:
    v4: list[str] = []
    v6: list[str] = []
    for a in addresses:
        ip = ipaddress.ip_interface(a).ip
        (v4 if ip.version == 4 else v6).append(str(ip))
    return v4, v6


def _subnets(addresses: Iterable[str]) -> tuple[list[str], list[str]]:
    v4: list[str] = []
    v6: list[str] = []
    for a in addresses:
        net = ipaddress.ip_interface(a).network
        (v4 if net.version == 4 else v6).append(str(net))
    return sorted(set(v4)), sorted(set(v6))


def _na_target(addresses: Sequence[str]) -> str:
    """A neighbour advert's target address (ICMPv6 bytes 8-23) as nft's raw payload set of integers."""
    return _set(hex(int(ipaddress.IPv6Address(a))) for a in addresses)


def _common(host: HostAddresses) -> list[str]:
    out = [
        # A VLAN tag would carry a frame past every L3 rule below: a guest has no business tagging.
        f"iifname {TAPS} ether type {{ vlan, 8021ad }} drop",
        f"iifname {TAPS} udp sport {{ 67, 547 }} drop",
        f"iifname {TAPS} icmpv6 type {{ nd-router-advert, nd-redirect }} drop",
        f"iifname {TAPS} icmp type redirect drop",
    ]
    if host.v4:
        out += [f"iifname {TAPS} ip saddr {_set(host.v4)} drop", f"iifname {TAPS} arp saddr ip {_set(host.v4)} drop"]
    if host.v6:
        out += [
            f"iifname {TAPS} ip6 saddr {_set(host.v6)} drop",
            f"iifname {TAPS} icmpv6 type nd-neighbor-advert @th,64,128 {_na_target(host.v6)} drop",
        ]
    return out


def _anti_spoof(t: TapRules) -> list[str]:
    """The rules of a NIC with a MAC and addresses, in its own prerouting chain (no `iifname` needed)."""
    own4, own6 = _ips(t.addresses)
    own6 = [*own6, eui64_link_local(t.mac)]
    return [
        f"ether saddr != {t.mac} drop",
        "ether type != { ip, ip6, arp } drop",
        f"ip saddr != {_set([*own4, '0.0.0.0'])} drop",
        f"ip6 saddr != {_set([*own6, '::'])} drop",
        f"{_not_in('arp', 'arp saddr ip', own4)} drop",
        f"arp saddr ether != {t.mac} drop",
        f"icmpv6 type nd-neighbor-advert @th,64,128 != {_na_target(own6)} drop",
    ]


def _bindings(taps: Sequence[TapRules]) -> list[str]:
    """Each anti-spoofed NIC's addresses (its EUI-64 link-local one included) are its own: from any other
    port, sending from one or claiming it (ARP, a neighbour advert) is dropped. One rule per kind, over a set
    of (address, tap) pairs."""
    v4: list[tuple[str, str]] = []
    v6: list[tuple[str, str]] = []
    for t in taps:
        own4, own6 = _ips(t.addresses)
        v4 += [(a, t.tap) for a in own4]
        v6 += [(a, t.tap) for a in [*own6, eui64_link_local(t.mac)]]
    out: list[str] = []
    if v4:
        addrs, pairs = _set(sorted({a for a, _ in v4})), _set(f'{a} . "{tap}"' for a, tap in v4)
        out += [
            f"ip saddr {addrs} ip saddr . iifname != {pairs} drop",
            f"arp saddr ip {addrs} arp saddr ip . iifname != {pairs} drop",
        ]
    if v6:
        addrs, pairs = _set(sorted({a for a, _ in v6})), _set(f'{a} . "{tap}"' for a, tap in v6)
        targets = _na_target(sorted({a for a, _ in v6}))
        target_pairs = _set(f'{hex(int(ipaddress.IPv6Address(a)))} . "{tap}"' for a, tap in v6)
        out += [
            f"ip6 saddr {addrs} ip6 saddr . iifname != {pairs} drop",
            f"icmpv6 type nd-neighbor-advert @th,64,128 {targets} @th,64,128 . iifname != {target_pairs} drop",
        ]
    return out


@dataclass
class _Policy:
    """A PRIVATE or NONE NIC's rules: from the guest (its prerouting chain), bridged to it from another port,
    and sent to it by the host."""

    pre: list[str] = field(default_factory=list)
    into: list[str] = field(default_factory=list)
    out: list[str] = field(default_factory=list)


def _policy(t: TapRules, host: HostAddresses) -> _Policy:
    if t.policy == net_rules.PRIVATE:
        sub4, sub6 = _subnets(t.addresses)
        reach4 = [*sub4, *host.v4]
        reach6 = [*sub6, *host.v6, _LINK_LOCAL6]
        return _Policy(
            pre=[
                f"{_not_in('ip', 'ip daddr', [*reach4, _BROADCAST4])} drop",
                f"{_not_in('ip6', 'ip6 daddr', [*reach6, _LINK_MULTICAST6])} drop",
            ],
            into=[
                f"{_not_in('ip', 'ip saddr', sub4)} drop",
                f"{_not_in('ip6', 'ip6 saddr', [*sub6, _LINK_LOCAL6])} drop",
            ],
            out=[f"{_not_in('ip', 'ip saddr', reach4)} drop", f"{_not_in('ip6', 'ip6 saddr', reach6)} drop"],
        )
    if t.policy == net_rules.NONE:  # nothing bridged to or from another port: a rule of the forward chain's
        return _Policy(
            pre=[
                f"{_not_in('ip', 'ip daddr', [*host.v4, _BROADCAST4])} drop",
                f"{_not_in('ip6', 'ip6 daddr', [*host.v6, _LINK_MULTICAST6])} drop",
            ],
            out=[f"{_not_in('ip', 'ip saddr', host.v4)} drop", f"{_not_in('ip6', 'ip6 saddr', host.v6)} drop"],
        )
    return _Policy()


def _names(taps: Iterable[TapRules]) -> str:
    return _set(f'"{t.tap}"' for t in taps)


def _vmap(key: str, chains: dict[str, str]) -> list[str]:
    """One rule jumping to each tap's own chain: a frame meets its own tap's rules, not every tap's."""
    if not chains:
        return []
    return [f"{key} vmap {_set(f'{chr(34)}{tap}{chr(34)} : jump {chain}' for tap, chain in chains.items())}"]


def _chain(name: str, rules: list[str], hook: str = "", priority: int = 0) -> str:
    head = f"\t\ttype filter hook {hook} priority {priority}; policy accept;\n" if hook else ""
    body = "".join(f"\t\t{r}\n" for r in rules)
    return f"\tchain {name} {{\n{head}{body}\t}}\n"


def _table(family: str, name: str, chains: list[str]) -> str:
    # `table` then `delete table` then the new one: in one transaction, whether or not it existed before.
    return f"table {family} {name}\ndelete table {family} {name}\ntable {family} {name} {{\n{''.join(chains)}}}\n"


def build(taps: Sequence[TapRules], host: HostAddresses) -> Ruleset:
    """The whole ruleset for these NICs and the host's addresses on their bridges."""
    guarded = [t for t in taps if t.anti_spoofed]
    pre, fwd, out = _common(host) + _bindings(guarded), [], []
    ssh = [t for t in taps if t.ssh_from_host_only]
    if ssh:  # ahead of everything else in the forward and output chains
        fwd.append(f"oifname {_names(ssh)} tcp dport 22 drop")
        out += [
            f"oifname {_names(ssh)} {_not_in('ip', 'ip saddr', host.v4)} tcp dport 22 drop",
            f"oifname {_names(ssh)} {_not_in('ip6', 'ip6 saddr', host.v6)} tcp dport 22 drop",
        ]
    none = [t for t in guarded if t.policy == net_rules.NONE]
    if none:
        fwd += [f"iifname {_names(none)} drop", f"oifname {_names(none)} drop"]
    chains: list[str] = []
    jumps: dict[str, dict[str, str]] = {"pre": {}, "into": {}, "out": {}}
    for t in guarded:
        policy = _policy(t, host)
        for kind, rules in (("pre", _anti_spoof(t) + policy.pre), ("into", policy.into), ("out", policy.out)):
            if rules:
                jumps[kind][t.tap] = f"{kind}_{t.tap}"
                chains.append(_chain(f"{kind}_{t.tap}", rules))
    pre += _vmap("iifname", jumps["pre"])
    fwd += _vmap("oifname", jumps["into"])
    out += _vmap("oifname", jumps["out"])
    per_tap = sum(len(c.splitlines()) - 2 for c in chains)
    # Priority -300: ahead of any other bridge filter (and of br_netfilter's own hooks at 0).
    bridge = _table(
        *BRIDGE_TABLE,
        [
            _chain("prerouting", pre, "prerouting", -300),
            _chain("forward", fwd, "forward", -300),
            _chain("output", out, "output", -300),
            *chains,
        ],
    )
    inet = _table(
        *INET_TABLE,
        [
            _chain("input", [f"iifname {TAPS} drop"], "input"),
            _chain("forward", [f"iifname {TAPS} drop", f"oifname {TAPS} drop"], "forward"),
            _chain("output", [f"oifname {TAPS} drop"], "output"),
        ],
    )
    arp = _table(
        *ARP_TABLE,
        [_chain("input", [f"iifname {TAPS} drop"], "input"), _chain("output", [f"oifname {TAPS} drop"], "output")],
    )
    counts = {BRIDGE_TABLE: len(pre) + len(fwd) + len(out) + per_tap, INET_TABLE: 4, ARP_TABLE: 2}
    return Ruleset(bridge + inet + arp, counts)
