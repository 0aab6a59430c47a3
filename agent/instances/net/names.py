"""Names and addresses derived from the spec alone, so rules can name a tap before it exists.

A Linux interface name is at most 15 characters and an instance id up to 63:
a tap is `bc` and 13 hex digits of SHA-256 over the id and the NIC's index
(52 bits: a collision among the few thousand taps of a host is about 1 in
10^9). Every tap starts with `bc`, which the rules match as `bc*`, and which
no bridge may start with (bc.protocol.instance_net_rules).
"""

from __future__ import annotations

import hashlib
import ipaddress

from bc.protocol.instance_net_rules import TAP_PREFIX

IFNAMSIZ = 15
"""The longest interface name Linux takes (IFNAMSIZ less its terminating NUL)."""


def tap_name(instance_id: str, index: int) -> str:
    """The tap of NIC `index` of instance `instance_id`: `bc` + 13 hex digits, 15 characters."""
    digest = hashlib.sha256(f"{instance_id}\0{index}".encode()).hexdigest()
    return TAP_PREFIX + digest[: IFNAMSIZ - len(TAP_PREFIX)]


def eui64_link_local(mac: str) -> str:
    """The IPv6 link-local address a guest derives from its MAC (EUI-64, RFC 4291 appendix A): the one
    link-local address the rules let it send from, for neighbour discovery."""
    octets = bytes(int(x, 16) for x in mac.split(":"))
    eui = bytes([octets[0] ^ 0x02]) + octets[1:3] + b"\xff\xfe" + octets[3:6]
    return str(ipaddress.IPv6Address(b"\xfe\x80" + b"\0" * 6 + eui))


def nic_mac(instance_id: str, index: int, mac: str) -> str:
    """The NIC's MAC: the spec's, else one derived from the id and index (locally administered, unicast,
    in qemu's 52:54 range), so two guests on a bridge never share qemu's single default."""
    if mac:
        return mac
    digest = hashlib.sha256(f"mac\0{instance_id}\0{index}".encode()).digest()
    return ":".join(f"{b:02x}" for b in (0x52, 0x54, *digest[:4]))
