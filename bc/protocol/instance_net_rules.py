"""An instance's network fields: its NICs, `network_policy` and `ssh_from_host_only` (docs/instances.md).

Pure, shared by the control plane and the node (called from `bc.protocol.instance_rules`).

* A NIC names a host bridge: a Linux interface name (1-15 characters, no
  `/`, `:`, whitespace) that does **not** start with `bc`. Every instance tap is
  `bc…` and the node's nftables rules match `bc*`: a bridge of that name would
  match every tap rule.
* Its `mac`, when set, is six colon-separated hex octets, unicast (the low bit
  of the first octet clear) and not all zeros: the guard binds the guest to it.
* Its `addresses` are interfaces with a prefix (`10.0.0.5/24`, `fd00::5/64`),
  each a host address of its network (not the network or IPv4 broadcast
  address, not multicast, loopback, unspecified or link-local): what the guest
  may send from, and for `PRIVATE` the subnets it may reach.
* `network_policy` is `EGRESS` (or empty), `PRIVATE` or `NONE`. `PRIVATE` and
  `NONE` can be expressed only on NICs whose MAC and addresses are known, so
  every NIC of such an instance needs both ("a policy that cannot be expressed").
* Across a section an address or a MAC belongs to one NIC: the rules bind each
  to its tap, so two claimants would make either's traffic someone else's.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Final

from bc.protocol.pb import spec_pb2

EGRESS: Final = "EGRESS"
PRIVATE: Final = "PRIVATE"
NONE: Final = "NONE"
POLICIES: tuple[str, ...] = (EGRESS, PRIVATE, NONE)

TAP_PREFIX: Final = "bc"
"""Every instance tap's name starts with it (agent.instances.net.names); no bridge may."""

MAX_NICS = 8
MAX_ADDRESSES = 16
IFNAME = re.compile(r"[A-Za-z0-9_.-][A-Za-z0-9_.@+-]{0,14}")
MAC = re.compile(r"[0-9a-f]{2}(:[0-9a-f]{2}){5}")


class NetRuleError(ValueError):
    """`field` breaks a rule, `why` in one clause (instance_rules turns it into its own error)."""

    def __init__(self, field: str, why: str) -> None:
        super().__init__(f"{field} {why}")
        self.field, self.why = field, why


def policy(inst: spec_pb2.Instance) -> str:
    """The instance's network policy, empty read as EGRESS."""
    return inst.network_policy or EGRESS


def guarded(inst: spec_pb2.Instance) -> bool:
    """Whether the instance needs rules beyond the common ones to run at all: a policy that confines it, or SSH
    from the host only. Such an instance never runs while its rules are not loaded."""
    return policy(inst) != EGRESS or inst.ssh_from_host_only


def is_network_field(field: str) -> bool:
    """Whether a refused field (as InstanceRuleError names it) is one of an instance's network fields."""
    last = field.rsplit(".", 1)[-1]
    return ".nics" in field or last.startswith("nics") or last in ("network_policy", "ssh_from_host_only")


def check_mac(mac: str, field: str) -> None:
    if not MAC.fullmatch(mac):
        raise NetRuleError(field, f"{mac!r} is not a MAC address (six lowercase hex octets, colon-separated)")
    if int(mac[:2], 16) & 1:
        raise NetRuleError(field, f"{mac} is a multicast address; a guest's MAC must be unicast")
    if mac == "00:00:00:00:00:00":
        raise NetRuleError(field, "is all zeros; a guest's MAC must be unicast")


def parse_address(text: str, field: str) -> ipaddress.IPv4Interface | ipaddress.IPv6Interface:
    """One NIC address, checked (NetRuleError when it is not a guest's own host address with its prefix)."""
    if "/" not in text:
        raise NetRuleError(field, f"{text!r} has no prefix length (write it as 10.0.0.5/24 or fd00::5/64)")
    try:
        iface = ipaddress.ip_interface(text)
    except ValueError:
        raise NetRuleError(field, f"{text!r} is not an address with a prefix length") from None
    ip, net = iface.ip, iface.network
    if ip.is_multicast or ip.is_loopback or ip.is_unspecified or ip.is_link_local:
        raise NetRuleError(field, f"{text} is not a unicast address a guest may own")
    if net.num_addresses > 2 and ip == net.network_address:
        raise NetRuleError(field, f"{text} is its network's own address, not a host's")
    if isinstance(net, ipaddress.IPv4Network) and net.num_addresses > 2 and ip == net.broadcast_address:
        raise NetRuleError(field, f"{text} is its network's broadcast address, not a host's")
    return iface


def check_nics(inst: spec_pb2.Instance, field: str) -> None:
    """Refuse (NetRuleError) an instance whose NICs or network policy break a rule."""
    pol = policy(inst)
    if pol not in POLICIES:
        raise NetRuleError(
            f"{field}.network_policy", f"must be one of {', '.join(POLICIES)}, not {inst.network_policy!r}"
        )
    if len(inst.nics) > MAX_NICS:
        raise NetRuleError(f"{field}.nics", f"holds {len(inst.nics)} NICs, more than {MAX_NICS}")
    for i, nic in enumerate(inst.nics):
        f = f"{field}.nics[{i}]"
        if not IFNAME.fullmatch(nic.bridge):
            raise NetRuleError(f"{f}.bridge", f"{nic.bridge!r} is not an interface name (1-15 of A-Z a-z 0-9 _ . -)")
        if nic.bridge.startswith(TAP_PREFIX):
            raise NetRuleError(
                f"{f}.bridge", f"{nic.bridge!r} starts with {TAP_PREFIX!r}, which every instance tap rule matches"
            )
        if nic.mac:
            check_mac(nic.mac, f"{f}.mac")
        if len(nic.addresses) > MAX_ADDRESSES:
            raise NetRuleError(f"{f}.addresses", f"holds {len(nic.addresses)} addresses, more than {MAX_ADDRESSES}")
        seen: set[str] = set()
        for j, a in enumerate(nic.addresses):
            ip = str(parse_address(a, f"{f}.addresses[{j}]").ip)
            if ip in seen:
                raise NetRuleError(f"{f}.addresses[{j}]", f"{ip} appears twice")
            seen.add(ip)
        if pol != EGRESS and not (nic.mac and nic.addresses):
            raise NetRuleError(
                f,
                f"has no {'MAC' if not nic.mac else 'addresses'}: network_policy {pol} is a policy that cannot be"
                " expressed without both on every NIC",
            )


def check_claims(instances: list[spec_pb2.Instance]) -> None:
    """Refuse (NetRuleError) a section in which two NICs claim the same MAC or address."""
    macs: dict[str, str] = {}
    ips: dict[str, str] = {}
    for k, inst in enumerate(instances):
        for i, nic in enumerate(inst.nics):
            f = f"instances[{k}].nics[{i}]"
            if nic.mac:
                if nic.mac in macs:
                    raise NetRuleError(f"{f}.mac", f"{nic.mac} is {macs[nic.mac]}'s too")
                macs[nic.mac] = f"instance {inst.id}"
            for j, a in enumerate(nic.addresses):
                ip = str(ipaddress.ip_interface(a).ip)
                if ip in ips and ips[ip] != f"instance {inst.id}":
                    raise NetRuleError(f"{f}.addresses[{j}]", f"{ip} is {ips[ip]}'s too")
                ips[ip] = f"instance {inst.id}"
