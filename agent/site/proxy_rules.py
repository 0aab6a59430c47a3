"""Where `site.httpProxy` may go: the pure rule, given the addresses the agent resolved.

The reference's rule (delivery.md, signed intent) in one function. A request is `forbidden-target` when:

1. its URL is not http(s) with a host, or carries credentials;
2. its path is under `/redfish` (any case): Redfish is what `bmc.*` speaks, under the quorum;
3. its host is a BMC host the site drove or the spec lists (by name), or resolves to one of their addresses,
   or to an address in the site's `bmc_networks`;
4. its `target_node_id` is not one of the section's `proxy_targets` (no targets: nothing is reachable);
5. an IP literal is not one of the target's addresses; a name is neither one of the target's names nor
   resolves only to the target's addresses (and a listed name must still resolve only to them: a name
   that moved is not followed). Nothing that resolves to nothing is dialled.

`allowed()` returns the addresses to dial: the agent connects to one of them, never resolving again, so a
DNS answer that changes between the check and the dial (rebinding) cannot move the request.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence
from urllib.parse import urlsplit

from bc.protocol.pb import spec_pb2

FORBIDDEN_TARGET = "forbidden-target"


class Forbidden(Exception):
    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


def url_host(url: str) -> str:
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises on a bad port
    except ValueError as e:
        raise Forbidden(f"the URL does not parse ({e})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise Forbidden("the URL must be http or https with a host")
    if parts.username is not None or parts.password is not None:
        raise Forbidden("the URL must not carry credentials")
    return parts.hostname.lower()


def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def _norm(addresses: Iterable[str]) -> set[str]:
    out = set()
    for a in addresses:
        ip = _ip(a)
        out.add(str(ip) if ip is not None else a.lower())
    return out


def allowed(
    url: str,
    target_node_id: str,
    targets: Sequence[spec_pb2.SiteProxyTarget],
    bmc_hosts: Iterable[str],
    bmc_addresses: Iterable[str],
    bmc_networks: Sequence[ipaddress.IPv4Network | ipaddress.IPv6Network],
    resolved: Sequence[str],
) -> list[str]:
    """The addresses to dial for `url`; Forbidden(why) by the rules above. `resolved`: what the URL's host
    resolved to (the literal itself for an IP); `bmc_addresses`: what the BMC hosts resolve to."""
    host = url_host(url)
    path = urlsplit(url).path.lower()
    if path == "/redfish" or path.startswith("/redfish/"):
        raise Forbidden("a /redfish path is a BMC's: site.httpProxy never reaches a BMC")
    hosts = _norm(bmc_hosts)
    literal = _ip(host.strip("[]"))
    key = str(literal) if literal is not None else host
    if key in hosts:
        raise Forbidden(f"{host} is a BMC this site drives: site.httpProxy never reaches a BMC")
    addrs = _norm(resolved)
    if not addrs:
        raise Forbidden(f"{host} resolves to no address")
    bad = addrs & (hosts | _norm(bmc_addresses))
    if bad:
        raise Forbidden(f"{host} resolves to a BMC's address ({sorted(bad)[0]}): site.httpProxy never reaches a BMC")
    for a in addrs:
        ip = _ip(a)
        if ip is not None and any(ip in net for net in bmc_networks):
            raise Forbidden(f"{a} is in the site's BMC networks: site.httpProxy never reaches a BMC")
    target = next((t for t in targets if t.node_id == target_node_id), None)
    if target is None:
        raise Forbidden(f"{target_node_id!r} is not a proxy target of this site")
    listed = _norm(target.addresses)
    if literal is not None:
        if key not in listed:
            raise Forbidden(f"{host} is not an address of {target_node_id}")
    elif not addrs <= listed:
        raise Forbidden(f"{host} resolves to addresses that are not {target_node_id}'s")
    return sorted(addrs)
