"""Usage by class: the rows of `bc usage` per key *and* device class, MIG instances per profile.

`usage_windows.aggregate` adds atom-milliseconds by key, whatever the atoms were; a MIG slice and a shared
slot then counted as a GPU. Here each (key, class) is summed apart, and a `gpu.mig` reservation's use is
cut by the profile of each instance it booked: a window of 2 atoms, a 3g.40gb and a 2g.20gb, is half
3g.40gb instance-time and half 2g.20gb (integer milliseconds, the remainder to the first profile, so the
parts add up to the whole). The profiles come from the node's inventory as it stands now: an instance
the node no longer reports (the GPU re-partitioned since, or the node deleted) has the profile "".
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from bc.control.capacity.usage_windows import BY, UsageWindow

MIG = "gpu.mig"


@dataclass(frozen=True)
class ClassPart:
    """A sum before MIG profiles are known: by key and class, and by reservation for `gpu.mig`."""

    key: str
    device_class: str
    mig_reservation: str  # "" unless device_class is gpu.mig


@dataclass(frozen=True)
class ClassRow:
    """One line of `bc usage`: a key, a class (and MIG profile), what it used in the range."""

    key: str
    device_class: str
    profile: str
    atom_ms: int
    windows: int

    @property
    def atom_seconds(self) -> float:
        return self.atom_ms / 1000


def part_of(w: UsageWindow, by: str) -> ClassPart:
    if by not in BY:
        raise ValueError(f"usage is grouped by {', '.join(BY)}, not {by!r}")
    key = {"reservation": w.reservation_id, "tenant": w.tenant, "node": w.node_id}[by]
    return ClassPart(key, w.device_class, w.reservation_id if w.device_class == MIG else "")


def add_windows(
    sums: dict[ClassPart, tuple[int, int]],
    windows: Iterable[UsageWindow],
    since_ms: int | None,
    until_ms: int | None,
    by: str,
) -> None:
    """Add each window's part inside `[since, until)` (prorated to the millisecond, as `aggregate`)."""
    for w in windows:
        lo = w.start_ms if since_ms is None else max(w.start_ms, since_ms)
        hi = w.end_ms if until_ms is None else min(w.end_ms, until_ms)
        if hi <= lo:
            continue
        part = part_of(w, by)
        ms, n = sums.get(part, (0, 0))
        sums[part] = (ms + w.atoms * (hi - lo), n + 1)


def split_by_profile(atom_ms: int, profiles: Sequence[str]) -> list[tuple[str, int]]:
    """`atom_ms` of a reservation whose atoms have these profiles (one per atom), cut by profile in
    proportion to its atoms; the parts add up to `atom_ms` exactly. No atom known: all of it under ""."""
    if not profiles:
        return [("", atom_ms)]
    counts = Counter(profiles)
    total = len(profiles)
    parts = [(p, atom_ms * n // total) for p, n in sorted(counts.items())]
    rest = atom_ms - sum(ms for _, ms in parts)
    return [(p, ms + (rest if i == 0 else 0)) for i, (p, ms) in enumerate(parts)]


def class_rows(sums: Mapping[ClassPart, tuple[int, int]], mig_profiles: Mapping[str, Sequence[str]]) -> list[ClassRow]:
    """The rows, sorted by key, class and profile: MIG parts cut by `mig_profiles` (reservation -> the
    profile of each atom it booked) and merged per key and profile."""
    out: dict[tuple[str, str, str], tuple[int, int]] = {}
    for part, (ms, n) in sums.items():
        cuts = (
            split_by_profile(ms, mig_profiles.get(part.mig_reservation, ())) if part.device_class == MIG else [("", ms)]
        )
        for profile, part_ms in cuts:
            k = (part.key, part.device_class, profile)
            have_ms, have_n = out.get(k, (0, 0))
            out[k] = (have_ms + part_ms, have_n + n)
    return [ClassRow(k, c, p, ms, n) for (k, c, p), (ms, n) in sorted(out.items())]


__all__ = ["ClassPart", "ClassRow", "add_windows", "class_rows", "part_of", "split_by_profile"]
