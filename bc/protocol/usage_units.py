"""The units usage is billed in, one per device class: an atom of a class is one unit of that class.

A whole GPU is a GPU-hour, a MIG instance an instance-hour of its profile (a 1g.10gb hour is not a
3g.40gb hour, nor a GPU-hour), a shared slot a slot-hour. `bc usage`, its JSON and CSV, `bc nodes show`
and the TUI name the class beside every figure (docs/capacity.md "Usage by class"). Pure: the CLI and
the TUI read it from the wire's `UsageRow.device_class` and `profile`.
"""

from __future__ import annotations

UNITS: dict[str, str] = {"gpu": "GPU-hours", "gpu.mig": "instance-hours", "gpu.slot": "slot-hours"}
"""The unit of each device class (its atom held for an hour)."""

SHORT_UNITS: dict[str, str] = {"gpu": "GPU·h", "gpu.mig": "MIG·h", "gpu.slot": "slot·h"}
"""The same, short, where a column is narrow (the TUI)."""


def unit_of(device_class: str) -> str:
    """`GPU-hours`, `instance-hours`, `slot-hours`; `atom-hours` for a class this build does not know."""
    return UNITS.get(device_class, "atom-hours")


def class_label(device_class: str, profile: str = "") -> str:
    """`gpu`, `gpu.slot`, `gpu.mig 1g.10gb` (`gpu.mig ?` when the profile is not known any more)."""
    if device_class == "gpu.mig":
        return f"gpu.mig {profile or '?'}"
    return device_class or "?"


def hours(atom_ms: int) -> float:
    return atom_ms / 3_600_000


def amount(atom_ms: int, device_class: str, profile: str = "", *, short: bool = False) -> str:
    """`2.500 GPU-hours`, `0.750 instance-hours (1g.10gb)`; short: `2.5 GPU·h`, `0.8 MIG·h 1g.10gb`."""
    if short:
        text = f"{hours(atom_ms):.1f} {SHORT_UNITS.get(device_class, 'atom·h')}"
        return f"{text} {profile or '?'}" if device_class == "gpu.mig" else text
    text = f"{hours(atom_ms):.3f} {unit_of(device_class)}"
    return f"{text} ({profile or '?'})" if device_class == "gpu.mig" else text


__all__ = ["SHORT_UNITS", "UNITS", "amount", "class_label", "hours", "unit_of"]
