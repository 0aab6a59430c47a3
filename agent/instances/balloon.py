"""Memory ballooning: how far to inflate or deflate each guest's balloon, from the host's memory pressure. Pure.

The reference's rules (delivery.md, "Memory ballooning"), every 30 s over the
running guests of bc's whose placement asks for a balloon:

* less than 10 % of memory available, or a memory stall (PSI `some avg10`) of
  10 % or more: inflate balloons to cover the shortfall below 10 % (at least
  2 % of host memory while stalled), first from the guests with the most memory
  above their floor, at most a quarter of a guest's memory per pass;
* more than 20 % available and no stall: deflate every inflated balloon a step
  (a quarter of the guest's memory), within what is free above 20 %;
* in between: leave them.

A guest never goes below its floor: `floor_percent` of its memory (10-100,
default 50), or what it uses plus 10 % of its memory when that is higher; a
guest whose use is unknown counts as using all of it, so nothing is taken.
Sizes are what the balloon leaves the guest (QMP's `actual`), in MiB.
"""

from __future__ import annotations

from dataclasses import dataclass

from agent.instances.admission import meminfo_kb

LOW_PERCENT = 10
HIGH_PERCENT = 20
STALL_PERCENT = 10.0
STALL_MIN_PERCENT = 2
DEFAULT_FLOOR_PERCENT = 50
INTERVAL_S = 30.0


@dataclass(frozen=True)
class HostPressure:
    total_mib: int
    available_mib: int
    stall_avg10: float = 0.0
    """PSI memory `some avg10`: the share of the last 10 s some task waited on memory."""

    @property
    def stalled(self) -> bool:
        return self.stall_avg10 >= STALL_PERCENT


@dataclass(frozen=True)
class BalloonGuest:
    id: str
    memory_mib: int
    actual_mib: int
    """What its balloon leaves it now."""
    used_mib: int | None = None
    """What the guest says it uses (its balloon driver's stats); None: unknown."""


def floor_mib(g: BalloonGuest, floor_percent: int = DEFAULT_FLOOR_PERCENT) -> int:
    """The least a guest is left: a share of its memory, or its use plus a tenth of its memory if higher."""
    by_share = g.memory_mib * floor_percent // 100
    used = g.memory_mib if g.used_mib is None else g.used_mib + g.memory_mib // 10
    return min(g.memory_mib, max(by_share, used))


def plan(host: HostPressure, guests: list[BalloonGuest], floor_percent: int = DEFAULT_FLOOR_PERCENT) -> dict[str, int]:
    """The new `actual` of each guest whose balloon should move (the others are left out)."""
    low = host.available_mib * 100 < host.total_mib * LOW_PERCENT
    if low or host.stalled:
        need = host.total_mib * LOW_PERCENT // 100 - host.available_mib
        if host.stalled:
            need = max(need, host.total_mib * STALL_MIN_PERCENT // 100)
        return _inflate(guests, need, floor_percent)
    if host.available_mib * 100 > host.total_mib * HIGH_PERCENT:
        return _deflate(guests, host.available_mib - host.total_mib * HIGH_PERCENT // 100)
    return {}


def _inflate(guests: list[BalloonGuest], need: int, floor_percent: int) -> dict[str, int]:
    out: dict[str, int] = {}
    room = sorted(guests, key=lambda g: (-(g.actual_mib - floor_mib(g, floor_percent)), g.id))
    for g in room:
        if need <= 0:
            break
        take = min(g.actual_mib - floor_mib(g, floor_percent), g.memory_mib // 4, need)
        if take > 0:
            out[g.id] = g.actual_mib - take
            need -= take
    return out


def _deflate(guests: list[BalloonGuest], spare: int) -> dict[str, int]:
    out: dict[str, int] = {}
    for g in sorted(guests, key=lambda g: g.id):
        give = min(g.memory_mib // 4 or 1, g.memory_mib - g.actual_mib, spare)
        if give > 0:
            out[g.id] = g.actual_mib + give
            spare -= give
    return out


def parse_pressure(meminfo: str, psi: str) -> HostPressure:
    """`MemTotal` and `MemAvailable` from /proc/meminfo, `some avg10` from /proc/pressure/memory (absent: no
    stall known); ValueError without MemTotal or MemAvailable."""
    kb = meminfo_kb(meminfo)
    if "MemTotal" not in kb or "MemAvailable" not in kb:
        raise ValueError("/proc/meminfo has no MemTotal or MemAvailable")
    stall = 0.0
    for line in psi.splitlines():
        if line.startswith("some "):
            for field in line.split()[1:]:
                k, _, v = field.partition("=")
                if k == "avg10":
                    stall = float(v)
    return HostPressure(kb["MemTotal"] // 1024, kb["MemAvailable"] // 1024, stall)
