"""The site section's and the site kinds' rules, read the same way by the control plane and the site agent.

The control plane refuses a `site` section that breaks them before it is stored
(`bc.protocol.spec_validation`), and the site agent checks again what it is sent
(a node never trusts that the server checked). Pure: no I/O, no DNS; the
agent's proxy check (`agent.site.proxy_rules`) resolves names and passes the
addresses in.

* A machine's name is a short token; its BMC URL is http(s) with a host and no
  path, query or credentials (credentials live in the site's 0600 file, never in
  a spec); its MACs are six lower-case hex pairs.
* The BMC credentials come from `credentials_file` (an absolute path) or `credentials_secret_ref` (a secret
  of the broker, docs/secrets.md), never both. Neither is allowed (a section without machines, or machines
  enrolled before their credentials): the kinds then fail `bmc-credentials`.
* The boot server's `dhcp_range` is two IPv4 addresses (and an optional netmask);
  `http_address` is `ip:port`; `interface` an interface name.
* A proxy target's addresses are IP literals; its names are DNS names; neither, nor a cached image's URL,
  names a listed machine's BMC.
"""

from __future__ import annotations

import ipaddress
import re
from urllib.parse import urlsplit

from bc.protocol import secret_refs
from bc.protocol.pb import spec_pb2

MACHINE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
MAC = re.compile(r"[0-9a-f]{2}(:[0-9a-f]{2}){5}")
INTERFACE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,14}")
DNS_NAME = re.compile(
    r"(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*"
)
SYSTEM_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")
SHA256 = re.compile(r"[0-9a-f]{64}")


class SiteRuleError(ValueError):
    """A field breaks a rule: `field` names it, the message says why in one clause."""

    def __init__(self, field: str, why: str) -> None:
        super().__init__(f"{field} {why}")
        self.field, self.why = field, why


def digest(text: str) -> str:
    """A cache image's digest as the cache names it: lower-case hex, without a `sha256:` prefix."""
    return text.removeprefix("sha256:")


def bmc_host(bmc_url: str) -> str:
    """The host (lower case, no brackets) of a BMC URL; SiteRuleError when it is not one."""
    check_bmc_url("bmc_url", bmc_url)
    host = urlsplit(bmc_url).hostname
    assert host is not None
    return host.lower()


def check_bmc_url(field: str, url: str) -> None:
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises on a port out of range
    except ValueError as e:
        raise SiteRuleError(field, f"is not a URL ({e})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise SiteRuleError(field, f"must be an http or https URL with a host, not {url!r}")
    if parts.username is not None or parts.password is not None:
        raise SiteRuleError(field, "must not carry credentials (they belong in the site's credentials file)")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise SiteRuleError(field, "must be the BMC's root URL, without a path, query or fragment")


def check_machine(field: str, m: spec_pb2.SiteMachine) -> None:
    if not MACHINE_NAME.fullmatch(m.name):
        raise SiteRuleError(f"{field}.name", f"{m.name!r} is not a machine name (1-63 of A-Z a-z 0-9 . _ -)")
    check_bmc_url(f"{field}.bmc_url", m.bmc_url)
    if m.system_id and not SYSTEM_ID.fullmatch(m.system_id):
        raise SiteRuleError(f"{field}.system_id", f"{m.system_id!r} is not a Redfish system id")
    for j, mac in enumerate(m.macs):
        if not MAC.fullmatch(mac):
            raise SiteRuleError(f"{field}.macs[{j}]", f"{mac!r} is not a MAC (aa:bb:cc:dd:ee:ff, lower case)")


def check_boot(b: spec_pb2.SiteBootServer) -> None:
    if not (b.interface or b.dhcp_range or b.http_address):
        return
    if not INTERFACE.fullmatch(b.interface):
        raise SiteRuleError("boot.interface", f"{b.interface!r} is not an interface name")
    parts = b.dhcp_range.split(",")
    try:
        if len(parts) not in (2, 3):
            raise ValueError("two addresses and an optional netmask")
        start, end = (ipaddress.IPv4Address(p) for p in parts[:2])
        if len(parts) == 3:
            ipaddress.IPv4Address(parts[2])
        if int(end) < int(start):
            raise ValueError("the end is below the start")
    except ValueError as e:
        raise SiteRuleError("boot.dhcp_range", f"{b.dhcp_range!r} is not start,end[,netmask] ({e})") from None
    parse_http_address(b.http_address)


def parse_http_address(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    try:
        if not sep:
            raise ValueError("no port")
        ipaddress.IPv4Address(host)
        p = int(port)
        if not 0 < p < 65536:
            raise ValueError("port out of range")
    except ValueError as e:
        raise SiteRuleError("boot.http_address", f"{text!r} is not ipv4:port ({e})") from None
    return host, p


def check_proxy_target(field: str, t: spec_pb2.SiteProxyTarget) -> None:
    if not MACHINE_NAME.fullmatch(t.node_id):
        raise SiteRuleError(f"{field}.node_id", f"{t.node_id!r} is not a node id")
    if not t.addresses:
        raise SiteRuleError(f"{field}.addresses", "is empty: a target is reached by its listed addresses")
    for j, a in enumerate(t.addresses):
        try:
            ipaddress.ip_address(a)
        except ValueError:
            raise SiteRuleError(f"{field}.addresses[{j}]", f"{a!r} is not an IP address") from None
    for j, n in enumerate(t.names):
        if not DNS_NAME.fullmatch(n):
            raise SiteRuleError(f"{field}.names[{j}]", f"{n!r} is not a DNS name")


def check_credentials_source(s: spec_pb2.SiteSection) -> None:
    """At most one of `credentials_file` (an absolute path) and `credentials_secret_ref` (a secret's name)."""
    if s.credentials_file and s.credentials_secret_ref:
        raise SiteRuleError(
            "credentials_secret_ref", "and credentials_file are both set: the BMC credentials come from one of them"
        )
    if s.credentials_file and not s.credentials_file.startswith("/"):
        raise SiteRuleError("credentials_file", "must be an absolute path")
    if s.credentials_secret_ref and not secret_refs.NAME_RE.fullmatch(s.credentials_secret_ref):
        raise SiteRuleError(
            "credentials_secret_ref",
            f"{s.credentials_secret_ref!r} is not a secret name (1-128 of a-z 0-9 . _ -)",
        )


def check_section(s: spec_pb2.SiteSection) -> None:
    """SiteRuleError for the first field of the section that breaks a rule above."""
    names: set[str] = set()
    macs: dict[str, str] = {}
    for i, m in enumerate(s.machines):
        check_machine(f"machines[{i}]", m)
        if m.name in names:
            raise SiteRuleError(f"machines[{i}].name", f"{m.name!r} is listed twice")
        names.add(m.name)
        for mac in m.macs:
            if mac in macs:
                raise SiteRuleError(f"machines[{i}].macs", f"{mac} is also {macs[mac]!r}'s")
            macs[mac] = m.name
    check_credentials_source(s)
    check_boot(s.boot)
    bmc_hosts = {bmc_host(m.bmc_url) for m in s.machines}
    for i, img in enumerate(s.cache_images):
        host = (urlsplit(img.url).hostname or "").lower()
        if host in bmc_hosts:
            raise SiteRuleError(
                f"cache_images[{i}].url", "names a machine's BMC: the site pulls images, never from a BMC"
            )
    for i, t in enumerate(s.proxy_targets):
        check_proxy_target(f"proxy_targets[{i}]", t)
        listed = {a.lower() for a in t.addresses} | {n.lower() for n in t.names}
        if listed & bmc_hosts:
            raise SiteRuleError(f"proxy_targets[{i}]", "names a machine's BMC: site.httpProxy never reaches a BMC")
