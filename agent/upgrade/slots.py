"""The A/B slots on disk: read them as a `swap_rules.Disk`, and take a step by writing what it changed.

Every step is computed by `swap_rules.apply` first; this module only makes
the disk match the new model, one durable operation at a time:

* the record (`upgrade.json`) is replaced atomically (temporary file, fsync, rename, fsync of the dir);
* `current` is replaced atomically: a new symlink `current.new` renamed over it, then the dir fsynced;
* PLACE renames `bc.<slot>.partial` to `bc.<slot>` (0755, fsynced first).

`install_dir_of` finds the install directory from how the process was
started: through a symlink named `current` to `bc.a` or `bc.b`. A process
started any other way (a zipapp, a checkout, a plain binary) has no slot to
swap, and a non-empty `daemon` section is UNSUPPORTED there.

`SlotStore` is the seam the controller (agent.upgrade.controller) goes
through: `Slots` here changes the install dir itself (as root, under
--fake-hw, in tests); `agent.helper.node_ops.HelperSlots` asks `bc helper`,
which verifies the release again before it places it, for a node whose
install dir is root's. The helper-backed store raises `SlotsRefused` and
`SlotsUnavailable` (the helper said no; the helper is down), which the
controller reports; `Slots` raises neither.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Protocol

from agent.offload import Offload, to_thread
from agent.upgrade.swap_rules import SLOTS, Disk, Installed, Plan, Record, Refused, Slot, Step, apply, other
from bc.pki.releases import Release
from bc.runtime.files import atomic_write as write_file_atomic
from bc.runtime.files import fsync_dir

CURRENT = "current"
RECORD = "upgrade.json"


def slot_file(slot: Slot) -> str:
    return f"bc.{slot}"


def partial_file(slot: Slot) -> str:
    """Where a download for `slot` is staged before PLACE renames it."""
    return f"{slot_file(slot)}.partial"


class SlotsRefused(OSError):
    """The store refused a step or a release (the helper's checks); the message is its sentence."""


class SlotsUnavailable(OSError):
    """The store cannot be reached now (the helper is down): nothing changed; try again later."""


class SlotStore(Protocol):
    """The A/B install dir as the controller changes it."""

    def partial_path(self, disk: Disk) -> Path:
        """Where the download for the other slot lands (the agent writes it)."""
        ...

    async def read(self) -> Disk: ...

    async def take(self, disk: Disk, step: Step, plan: Plan | None = None) -> Disk:
        """`step` (not PLACE: `place`) on the disk; the disk after it."""
        ...

    async def remember(self, disk: Disk, refused: Refused | None) -> Disk: ...

    async def place(self, disk: Disk, plan: Plan, release: Release, signature: bytes) -> Disk:
        """PLACE the staged download, which the controller verified against `release` and `signature`."""
        ...


def install_dir_of(argv0: str) -> Path | None:
    """The install dir when `argv0` is a `current` link to a slot, else None."""
    p = Path(argv0)
    if p.name != CURRENT or not p.is_symlink():
        return None
    target = os.readlink(p)
    if Path(target).name not in (slot_file("a"), slot_file("b")) or os.sep in target:
        return None
    return p.parent.absolute()


def install(install_dir: Path, binary: bytes | Path, *, version: str) -> None:
    """A fresh layout: `bc.a` holds `binary`, `current` names it, the record knows its version (sequence 0).
    What a package's install step (or a test) does once."""
    install_dir.mkdir(parents=True, exist_ok=True)
    data = binary.read_bytes() if isinstance(binary, Path) else binary
    write_file_atomic(install_dir / slot_file("a"), data, mode=0o755)
    _point(install_dir, "a")
    write_file_atomic(install_dir / RECORD, _record_bytes(Record(slots={"a": Installed(version, 0)})))


def _record_bytes(record: Record) -> bytes:
    return (json.dumps(record.to_json(), indent=2, sort_keys=True) + "\n").encode()


def write_record(install_dir: Path, record: Record) -> None:
    write_file_atomic(install_dir / RECORD, _record_bytes(record))


def _point(install_dir: Path, slot: Slot) -> None:
    tmp = install_dir / f"{CURRENT}.new"
    tmp.unlink(missing_ok=True)
    os.symlink(slot_file(slot), tmp)
    os.replace(tmp, install_dir / CURRENT)
    fsync_dir(install_dir)


def read_disk(install_dir: Path) -> Disk:
    target = Path(os.readlink(install_dir / CURRENT)).name
    current: Slot = "b" if target == slot_file("b") else "a"
    slots = frozenset(s for s in SLOTS if (install_dir / slot_file(s)).is_file())
    partial = any((install_dir / partial_file(s)).exists() for s in SLOTS)
    try:
        doc = json.loads((install_dir / RECORD).read_text("utf-8"))
    except FileNotFoundError:
        doc = {}
    return Disk(current=current, slots=slots, partial=partial, record=Record.from_json(doc))


def realize(install_dir: Path, old: Disk, new: Disk, step: Step) -> None:
    """Make the install dir, which holds `old`, hold `new` (what `step` made of it): one durable change at a
    time (blocking)."""
    if step is Step.PLACE:
        to = other(old.current)
        partial = install_dir / partial_file(to)
        fd = os.open(partial, os.O_RDONLY)
        try:
            os.fchmod(fd, 0o755)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(partial, install_dir / slot_file(to))
        fsync_dir(install_dir)
    if new.record != old.record:
        write_record(install_dir, new.record)
    if new.current != old.current:
        _point(install_dir, new.current)


class Slots:
    """One install dir the agent writes itself; every blocking call goes through the agent's offload."""

    def __init__(self, install_dir: Path, offload: Offload = to_thread) -> None:
        self.dir = install_dir
        self.offload = offload

    def partial_path(self, disk: Disk) -> Path:
        return self.dir / partial_file(other(disk.current))

    def path(self, slot: Slot) -> Path:
        return self.dir / slot_file(slot)

    async def read(self) -> Disk:
        return await self.offload(read_disk, self.dir)

    async def take(self, disk: Disk, step: Step, plan: Plan | None = None) -> Disk:
        """Apply `step` to the model, then make the disk match it; returns the new model."""
        new = apply(disk, step, plan)
        await self.offload(realize, self.dir, disk, new, step)
        return new

    async def place(self, disk: Disk, plan: Plan, release: Release, signature: bytes) -> Disk:
        """The controller verified the download: PLACE it."""
        return await self.take(disk, Step.PLACE, plan)

    async def remember(self, disk: Disk, refused: Refused | None) -> Disk:
        """The record with `refused` as the last release refused (None: forgotten), written when it changed."""
        from dataclasses import replace

        new = replace(disk, record=replace(disk.record, refused=refused))
        if new.record != disk.record:
            await self.offload(write_record, self.dir, new.record)
        return new
