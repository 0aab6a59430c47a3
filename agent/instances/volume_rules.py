"""Persistent volumes' pure rules: the space a volume may be promised, and one writer at a time.

* **Never overcommitted.** A volume is a sparse file: its unwritten space is promised, not taken. A new
  volume, or a growth, must fit in the data directory filesystem's available space (statfs `Bavail`) less
  a reserve (5 % of the filesystem, at least `min_reserve`, 2 GiB on a node) less every volume's unwritten
  space; one that does not keeps its size and the instances that attach it say why.
* **One writer.** A volume open read-write in one instance may be opened by no other; one open read-only
  may be opened read-only again, never read-write. The open set comes from the running and paused domains
  and changes as a pass stops, deletes and starts them, so a stop that failed never lets a second writer in;
  starts run in spec order, so the first in spec order keeps it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

MIB: Final = 1 << 20
RESERVE_PERCENT: Final = 5
MIN_RESERVE: Final = 2 << 30


@dataclass(frozen=True)
class Space:
    """The volume store's filesystem and what its volumes promise (StatusReport.volume_storage)."""

    total: int
    available: int
    reserved: int
    committed: int
    """The sum of every volume's size."""
    outstanding: int
    """The sum of every volume's unwritten (sparse) space."""


def reserve(total: int, min_reserve: int = MIN_RESERVE) -> int:
    return max(total * RESERVE_PERCENT // 100, min_reserve)


def promise_refusal(volume_id: str, needed: int, space: Space) -> str | None:
    """None when `needed` more bytes of unwritten space may be promised; else the instance's message."""
    can = space.available - space.reserved - space.outstanding
    if needed <= can:
        return None
    return (
        f"volume {volume_id}: {_mib(needed)} MiB needed, {max(_mib(can), 0)} MiB can still be promised to volumes"
        f" on this host ({_mib(space.available)} MiB free, {_mib(space.reserved)} MiB reserved,"
        f" {_mib(space.outstanding)} MiB promised to volumes' unwritten space)"
    )


def _mib(n: int) -> int:
    return -(-n // MIB) if n > 0 else n // MIB


@dataclass
class OpenVolumes:
    """Which instance has which volume open, and how (True: read-only)."""

    holders: dict[str, dict[str, bool]] = field(default_factory=dict)

    def refusal(self, instance_id: str, volume_id: str, read_only: bool) -> str | None:
        """None when `instance_id` may open `volume_id` so; else why not, in one clause."""
        for other, ro in sorted(self.holders.get(volume_id, {}).items()):
            if other == instance_id:
                continue
            if not ro:
                return f"volume {volume_id} is open read-write in instance {other}: one writer at a time"
            if not read_only:
                return f"volume {volume_id} is open read-only in instance {other}: no writer beside readers"
        return None

    def open(self, instance_id: str, volume_id: str, read_only: bool) -> None:
        self.holders.setdefault(volume_id, {})[instance_id] = read_only

    def close(self, instance_id: str, volume_id: str | None = None) -> None:
        """Let go of one volume, or of all the instance has open."""
        for vid in [volume_id] if volume_id is not None else list(self.holders):
            held = self.holders.get(vid, {})
            held.pop(instance_id, None)
            if not held:
                self.holders.pop(vid, None)

    def of(self, instance_id: str) -> list[str]:
        return sorted(v for v, held in self.holders.items() if instance_id in held)

    def ids(self) -> set[str]:
        return set(self.holders)
