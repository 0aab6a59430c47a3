"""Persistent taps on their bridges, and the host's addresses on those bridges, over netlink (pyroute2's
asyncio API: nothing here blocks the loop).

* `ensure` creates the tap (`tuntap`, mode tap, no packet info, owned by the user qemu runs as, so a
  confined VMM without CAP_NET_ADMIN may open it) when it is missing or owned by another user, puts it on
  its bridge and brings it up, before qemu starts; qemu opens it by name. An interface of that name that is
  not a tap is never taken over, and a bridge that does not exist fails the start.
* `remove` deletes a tap bc named, and only a tap.
* `host_addresses` reads the host's own addresses on the bridges (the rules let guests reach them, and keep
  guests from sending from them).

pyroute2 is imported on first use: it takes about a third of a second, which every `bc node` without
VMs (and every test that starts one) would otherwise pay.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Protocol

from agent.instances.net.ruleset import HostAddresses

if TYPE_CHECKING:
    from pyroute2 import AsyncIPRoute

TUN_KIND = "tun"
BRIDGE_KIND = "bridge"


class TapError(Exception):
    """A tap could not be made ready (or removed): one sentence."""


def _netlink() -> tuple[Any, type[Exception]]:
    """pyroute2's asyncio IPRoute class and its NetlinkError (imported here, on first use)."""
    from pyroute2 import AsyncIPRoute
    from pyroute2.netlink.exceptions import NetlinkError

    return AsyncIPRoute, NetlinkError


def _code(e: Exception) -> int:
    code = getattr(e, "code", 0)
    return code if isinstance(code, int) else 0


async def _kind(ip: AsyncIPRoute, index: int) -> str:
    for link in await ip.link("get", index=index):
        return str(link.get_nested("IFLA_LINKINFO", "IFLA_INFO_KIND") or "")
    return ""


async def _owner(ip: AsyncIPRoute, index: int) -> int | None:
    for link in await ip.link("get", index=index):
        owner = link.get_nested("IFLA_LINKINFO", "IFLA_INFO_DATA", "IFLA_TUN_OWNER")
        return owner if isinstance(owner, int) else None
    return None


async def _index(ip: AsyncIPRoute, name: str) -> int | None:
    found = await ip.link_lookup(ifname=name)
    return int(found[0]) if found else None


async def ensure(tap: str, bridge: str, owner_uid: int | None = None) -> None:
    """The tap exists, is on `bridge`, and is up (TapError otherwise)."""
    uid = os.geteuid() if owner_uid is None else owner_uid
    iproute, NetlinkError = _netlink()
    try:
        async with iproute() as ip:
            br = await _index(ip, bridge)
            if br is None or await _kind(ip, br) != BRIDGE_KIND:
                raise TapError(f"the bridge {bridge} does not exist on this host")
            t = await _index(ip, tap)
            if t is not None and await _kind(ip, t) != TUN_KIND:
                raise TapError(f"an interface named {tap} exists and is not a tap; it is left alone")
            if t is not None and await _owner(ip, t) != uid:  # an owner cannot be changed: made again
                await ip.link("del", index=t)
                t = None
            if t is None:
                await ip.link("add", ifname=tap, kind="tuntap", mode="tap", uid=uid, ifr={"no_pi": True})
                t = await _index(ip, tap)
                if t is None:
                    raise TapError(f"the tap {tap} vanished as it was made")
            await ip.link("set", index=t, master=br, state="up")
    except NetlinkError as e:
        raise TapError(f"cannot set up the tap {tap} on {bridge}: {os.strerror(_code(e))}") from None


async def remove(tap: str) -> None:
    """Delete the tap if it exists and is a tap (TapError when the kernel refuses)."""
    iproute, NetlinkError = _netlink()
    try:
        async with iproute() as ip:
            t = await _index(ip, tap)
            if t is not None and await _kind(ip, t) == TUN_KIND:
                await ip.link("del", index=t)
    except NetlinkError as e:
        if _code(e) != 19:  # ENODEV: gone meanwhile
            raise TapError(f"cannot delete the tap {tap}: {os.strerror(_code(e))}") from None


async def host_addresses(bridges: Iterable[str]) -> HostAddresses:
    """The host's addresses on these bridges (those that exist), IPv4 and IPv6, link-local included."""
    v4: set[str] = set()
    v6: set[str] = set()
    iproute, NetlinkError = _netlink()
    try:
        async with iproute() as ip:
            for name in sorted(set(bridges)):
                idx = await _index(ip, name)
                if idx is None:
                    continue
                async for a in await ip.addr("dump", index=idx):
                    if a.get("index") != idx:
                        continue
                    text = a.get("IFA_ADDRESS") or a.get("address")
                    if text:
                        addr = ipaddress.ip_address(str(text).split("%")[0])
                        (v4 if addr.version == 4 else v6).add(str(addr))
    except NetlinkError as e:
        raise OSError(_code(e), os.strerror(_code(e))) from None
    return HostAddresses(tuple(sorted(v4)), tuple(sorted(v6)))


class TapPort(Protocol):
    """What a runtime asks of the host's taps (NetlinkTaps; tests may give their own)."""

    async def ensure(self, tap: str, bridge: str, owner_uid: int | None = None) -> None: ...

    async def remove(self, tap: str) -> None: ...


class NetlinkTaps:
    """The qemu runtime's taps, owned by the user qemu runs as: the `owner_uid` of each call (a confined VMM's
    own uid), else this one's, else this process's."""

    def __init__(self, owner_uid: int | None = None) -> None:
        self.owner_uid = owner_uid

    async def ensure(self, tap: str, bridge: str, owner_uid: int | None = None) -> None:
        await ensure(tap, bridge, self.owner_uid if owner_uid is None else owner_uid)

    async def remove(self, tap: str) -> None:
        await remove(tap)
