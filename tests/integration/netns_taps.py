"""The qemu runtime's taps over netlink (agent.instances.net.taps) in the network namespace this runs in.

Run by tests/integration/test_instance_taps.py as `unshare -n python -m tests.integration.netns_taps`; prints
one JSON document of what it saw.
"""

from __future__ import annotations

import asyncio
import json
import subprocess

from agent.instances.net import taps
from agent.instances.net.names import tap_name


def link(name: str) -> dict[str, object]:
    doc = json.loads(
        subprocess.run(["ip", "-j", "-d", "link", "show", name], capture_output=True, text=True, check=True).stdout
    )
    return doc[0]  # type: ignore[no-any-return]


def links(prefix: str) -> list[str]:
    """This namespace's interfaces whose name starts with `prefix` (from netlink: /sys shows the host's)."""
    doc = json.loads(subprocess.run(["ip", "-j", "link", "show"], capture_output=True, text=True, check=True).stdout)
    return sorted(str(d["ifname"]) for d in doc if str(d["ifname"]).startswith(prefix))


async def refused(coro: object) -> str:
    try:
        await coro  # type: ignore[misc]
    except taps.TapError as e:
        return str(e)
    return ""


async def main() -> dict[str, object]:
    for argv in (
        ["ip", "link", "add", "br0", "type", "bridge"],
        ["ip", "link", "add", "br1", "type", "bridge"],
        ["ip", "addr", "add", "10.0.0.1/24", "dev", "br0"],
        ["ip", "addr", "add", "fd00::1/64", "dev", "br0"],
        ["ip", "addr", "add", "10.9.0.1/24", "dev", "br1"],
        ["ip", "link", "set", "br0", "up"],
        ["ip", "link", "add", "bcdummy", "type", "bridge"],
    ):
        subprocess.run(argv, check=True)
    tap = tap_name("web", 0)
    out: dict[str, object] = {}
    port = taps.NetlinkTaps(owner_uid=4242)
    await port.ensure(tap, "br0")
    info = link(tap)
    out["made"] = {
        "master": info.get("master"),
        "up": "UP" in info.get("flags", []),
        "kind": info.get("linkinfo", {}).get("info_kind"),
        "owner": info.get("linkinfo", {}).get("info_data", {}).get("user"),
        "persist": info.get("linkinfo", {}).get("info_data", {}).get("persist"),
        "pi": info.get("linkinfo", {}).get("info_data", {}).get("pi"),
    }
    await port.ensure(tap, "br1")  # again, on another bridge: the same tap moves
    out["moved_to"] = link(tap).get("master")
    await port.ensure(tap, "br1", owner_uid=4343)  # another VMM user: made again, owned by it
    out["owner_now"] = link(tap).get("linkinfo", {}).get("info_data", {}).get("user")
    out["no_bridge"] = await refused(port.ensure(tap_name("web", 1), "br9"))
    out["not_a_bridge"] = await refused(port.ensure(tap_name("web", 1), "lo"))
    out["not_a_tap"] = await refused(port.ensure("bcdummy", "br0"))
    await port.remove(tap)
    await port.remove(tap)  # gone already: fine
    await port.remove("bcdummy")  # not a tap: left alone
    out["left"] = links("bc")
    host = await taps.host_addresses(["br0", "br9"])
    out["host"] = {"v4": list(host.v4), "v6": [a for a in host.v6 if not a.startswith("fe80")]}
    return out


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main()), sort_keys=True))
