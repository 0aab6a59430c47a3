"""The A/B swap of a self-update, as a pure state machine over what is on disk.

Nothing here does I/O or reads a clock: `agent.upgrade.slots` performs each
step on a real install directory, and the tests run every step, and a crash
after each one, on this model alone (reference: failure modes, "Self-update").

The layout
----------
An install directory holds two slots, `bc.a` and `bc.b`, a symlink `current`
naming one of them (what the unit's `ExecStart` runs), and `upgrade.json`,
the record below. `current` is replaced by a rename, so at every instant it
names exactly one slot: whatever the moment of a crash, the next start runs
exactly one of the two binaries.

The theory
----------
The process that starts decides what happened from `upgrade.json` and from
where `current` points, never from the version the binary claims to be: a
lying or broken new binary cannot mark itself good nor the old one failed.

Forward steps (the old binary, in `daemon.upgrade`):

========  ==========================================  =======================
Step      What changes on disk                        A crash right after it
========  ==========================================  =======================
STAGE     the download lands in `bc.<to>.partial`     nothing armed: old runs
PLACE     verified, renamed to `bc.<to>`              nothing armed: old runs
ARM       record: pending{from, to, deadline}         old runs, sees `current`
                                                      still on `from`: aborted
SWITCH    `current` -> `bc.<to>`                      new runs, pending
RESTART   the process exits (systemd or a re-exec)    new runs, pending
========  ==========================================  =======================

A start with the record pending and `current` on `to` is upgrade-only: it
refuses every kind but `daemon.upgrade` until its first Welcome, which
CONFIRMs (record: confirmed, the floor raised to the release's sequence). If
the deadline passes first (a new process finds it passed, or the running one
sees it pass), it rolls back:

==========  ====================================  ===========================
Step        What changes on disk                  A crash right after it
==========  ====================================  ===========================
DISARM      record: rolling-back                  whichever runs finishes it
SWITCH_BACK `current` -> `bc.<from>`              old runs, finishes it
FAIL        record: failed, version never again   old runs, reports FAILED
RESTART     the process exits
==========  ====================================  ===========================

An `aborted` swap (the process died between ARM and SWITCH) is not the
version's fault: the old binary reports the command FAILED `interrupted` and
the version may be tried again. A `failed` one reports `update-failed` and
is never tried again automatically.

The floor: a confirmed release raises `floor` to its sequence: the sequence
the node runs, remembered across restarts. An upgrade to a sequence at or
below it is refused (`not-newer`, TUF's rollback rule: the signature covers
the sequence, so no one can renumber an old release), and a start whose
`current` names a slot recorded below the floor refuses to run at all. The
exact release a node runs (name, version and sequence of its slot) is
already there: no swap, no refusal.

A node follows one release name (once its slot records one) and one
platform (its own). A release refused or failed after its signature held is
remembered in `refused`: the same (name, sequence) is answered with that
refusal, without a download, until another release is offered (`remembered`).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

Slot = Literal["a", "b"]
SLOTS: tuple[Slot, Slot] = ("a", "b")

RecordState = Literal["idle", "pending", "rolling-back", "confirmed", "failed", "aborted"]
RECORD_STATES: tuple[RecordState, ...] = ("idle", "pending", "rolling-back", "confirmed", "failed", "aborted")

UPDATE_FAILED = "update-failed"
INTERRUPTED = "interrupted"
NOT_NEWER = "not-newer"
FAILED_BEFORE = "failed-before"
WRONG_PLATFORM = "wrong-platform"
WRONG_NAME = "wrong-name"
VERSION_MISMATCH = "version-mismatch"


def other(slot: Slot) -> Slot:
    return "b" if slot == "a" else "a"


class SwapError(Exception):
    """An illegal step for the state on disk: `can't <step> in state <state>` (a bug, never an outcome)."""


@dataclass(frozen=True)
class Installed:
    """What a slot holds, as the record remembers it (the version the release record named, its sequence, its
    name: empty for the first install, which no release record named)."""

    version: str
    sequence: int
    name: str = ""


@dataclass(frozen=True)
class Refused:
    """A release refused or failed after its signature held, remembered so that it is not tried again."""

    name: str
    sequence: int
    version: str
    reason: str
    message: str

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "sequence": self.sequence,
            "version": self.version,
            "reason": self.reason,
            "message": self.message,
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Refused:
        return cls(str(doc["name"]), int(doc["sequence"]), str(doc["version"]), str(doc["reason"]), str(doc["message"]))


@dataclass(frozen=True)
class Record:
    """`upgrade.json`: the only memory of a swap across restarts."""

    state: RecordState = "idle"
    command_id: str = ""
    from_slot: Slot = "a"
    to_slot: Slot = "b"
    version: str = ""
    sequence: int = 0
    deadline: float = 0.0
    """Wall-clock seconds: the new binary must be welcomed before it, across restarts."""
    floor: int = 0
    failed_versions: tuple[str, ...] = ()
    slots: Mapping[str, Installed] = field(default_factory=dict)
    refused: Refused | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "command_id": self.command_id,
            "from_slot": self.from_slot,
            "to_slot": self.to_slot,
            "version": self.version,
            "sequence": self.sequence,
            "deadline": self.deadline,
            "floor": self.floor,
            "failed_versions": list(self.failed_versions),
            "slots": {
                k: {"version": v.version, "sequence": v.sequence, "name": v.name} for k, v in sorted(self.slots.items())
            },
            "refused": self.refused.to_json() if self.refused is not None else None,
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Record:
        state = str(doc.get("state", "idle"))
        if state not in RECORD_STATES:
            raise ValueError(f"upgrade.json has an unknown state {state!r}")
        slots = {}
        for k, v in dict(doc.get("slots", {})).items():
            if k not in SLOTS:
                raise ValueError(f"upgrade.json names an unknown slot {k!r}")
            slots[k] = Installed(str(v["version"]), int(v["sequence"]), str(v.get("name", "")))
        from_slot, to_slot = str(doc.get("from_slot", "a")), str(doc.get("to_slot", "b"))
        if from_slot not in SLOTS or to_slot not in SLOTS:
            raise ValueError("upgrade.json names an unknown slot")
        return cls(
            state=state,
            command_id=str(doc.get("command_id", "")),
            from_slot=from_slot,
            to_slot=to_slot,
            version=str(doc.get("version", "")),
            sequence=int(doc.get("sequence", 0)),
            deadline=float(doc.get("deadline", 0.0)),
            floor=int(doc.get("floor", 0)),
            failed_versions=tuple(str(v) for v in doc.get("failed_versions", ())),
            slots=slots,
            refused=Refused.from_json(doc["refused"]) if doc.get("refused") else None,
        )


@dataclass(frozen=True)
class Disk:
    """What the steps change: where `current` points, which slots hold a whole binary, the record."""

    current: Slot
    slots: frozenset[Slot]
    partial: bool = False
    record: Record = field(default_factory=Record)


class Step(enum.Enum):
    STAGE = "stage"
    PLACE = "place"
    ARM = "arm"
    SWITCH = "switch"
    RESTART = "restart"
    CONFIRM = "confirm"
    DISARM = "disarm"
    SWITCH_BACK = "switch-back"
    FAIL = "fail"
    ABORT = "abort"


FORWARD: tuple[Step, ...] = (Step.STAGE, Step.PLACE, Step.ARM, Step.SWITCH, Step.RESTART)
ROLLBACK: tuple[Step, ...] = (Step.DISARM, Step.SWITCH_BACK, Step.FAIL, Step.RESTART)


@dataclass(frozen=True)
class Plan:
    """One upgrade: the release and the deadline the ARM step writes."""

    command_id: str
    version: str
    sequence: int
    deadline: float
    name: str = ""


@dataclass(frozen=True)
class Offer:
    """The signed fields of a release offered to this node that the rules look at (after its signature held)."""

    name: str
    version: str
    sequence: int
    platform: str


def unsettled(record: Record) -> tuple[str, str] | None:
    """(reason, one sentence) while a swap is still in flight: nothing else may start (and nothing is remembered)."""
    if record.state in ("pending", "rolling-back"):
        return UPDATE_FAILED, f"an update to {record.version} is still unconfirmed; try again once it settles"
    return None


def running_sequence(record: Record, current: Slot) -> int:
    """The sequence this node runs: the floor, or its slot's own when higher."""
    installed = record.slots.get(current)
    return max(record.floor, installed.sequence if installed is not None else 0)


def already_running(record: Record, current: Slot, offer: Offer) -> bool:
    """The offer is exactly the release `current` holds: nothing to do, and no downgrade either."""
    installed = record.slots.get(current)
    return (
        installed is not None
        and installed.sequence > 0
        and (installed.version, installed.sequence) == (offer.version, offer.sequence)
        and installed.name in ("", offer.name)
    )


def remembered(record: Record, offer: Offer) -> Refused | None:
    """The refusal this node already gave the same (name, sequence), if it is the last release refused."""
    r = record.refused
    if r is not None and (r.name, r.sequence) == (offer.name, offer.sequence):
        return r
    return None


def refusal(record: Record, current: Slot, offer: Offer, host_platform: str) -> tuple[str, str] | None:
    """(reason, one sentence) when an upgrade to this signed release must not start; None when it may."""
    if (why := unsettled(record)) is not None:
        return why
    what = f"release {offer.name} {offer.version} (sequence {offer.sequence})"
    if offer.platform != host_platform:
        return WRONG_PLATFORM, f"{what} is built for {offer.platform}, not for this node's {host_platform}"
    installed = record.slots.get(current)
    if installed is not None and installed.name and offer.name != installed.name:
        return WRONG_NAME, f"{what} is not of the release name {installed.name!r} this node runs"
    runs = running_sequence(record, current)
    if offer.sequence <= runs:
        return NOT_NEWER, (
            f"{what} is not newer than the sequence {runs} this node runs; a node never goes back"
            " (publish a newer release)"
        )
    if offer.version in record.failed_versions:
        return FAILED_BEFORE, f"release {offer.version} failed on this node before and is never retried automatically"
    return None


def apply(disk: Disk, step: Step, plan: Plan | None = None) -> Disk:
    """The disk after `step`; SwapError for a step that is illegal here."""
    r = disk.record
    if step is Step.STAGE:
        return replace(disk, partial=True)
    if step is Step.PLACE:
        if not disk.partial:
            raise SwapError("can't place in state no-download")
        to = other(disk.current)
        slots = dict(r.slots)
        if plan is not None:
            slots[to] = Installed(plan.version, plan.sequence, plan.name)
        return replace(disk, partial=False, slots=disk.slots | {to}, record=replace(r, slots=slots))
    if step is Step.ARM:
        if plan is None or r.state in ("pending", "rolling-back"):
            raise SwapError(f"can't arm in state {r.state}")
        to = other(disk.current)
        if to not in disk.slots:
            raise SwapError("can't arm in state unplaced")
        armed = replace(
            r,
            state="pending",
            command_id=plan.command_id,
            from_slot=disk.current,
            to_slot=to,
            version=plan.version,
            sequence=plan.sequence,
            deadline=plan.deadline,
        )
        return replace(disk, record=armed)
    if step is Step.SWITCH:
        if r.state != "pending" or disk.current != r.from_slot:
            raise SwapError(f"can't switch in state {r.state}")
        return replace(disk, current=r.to_slot)
    if step is Step.RESTART:
        return disk
    if step is Step.CONFIRM:
        if r.state != "pending" or disk.current != r.to_slot:
            raise SwapError(f"can't confirm in state {r.state}")
        return replace(disk, record=replace(r, state="confirmed", floor=max(r.floor, r.sequence)))
    if step is Step.DISARM:
        if r.state != "pending":
            raise SwapError(f"can't disarm in state {r.state}")
        return replace(disk, record=replace(r, state="rolling-back"))
    if step is Step.SWITCH_BACK:
        if r.state != "rolling-back":
            raise SwapError(f"can't switch back in state {r.state}")
        return replace(disk, current=r.from_slot)
    if step is Step.FAIL:
        if r.state != "rolling-back" or disk.current != r.from_slot:
            raise SwapError(f"can't fail in state {r.state}")
        failed = r.failed_versions if r.version in r.failed_versions else (*r.failed_versions, r.version)
        return replace(disk, record=replace(r, state="failed", failed_versions=failed))
    if step is Step.ABORT:
        if r.state != "pending" or disk.current != r.from_slot:
            raise SwapError(f"can't abort in state {r.state}")
        return replace(disk, record=replace(r, state="aborted"))
    raise SwapError(f"can't {step.value} in state {r.state}")  # pragma: no cover - the enum is exhaustive


class Start(enum.Enum):
    """What a starting process does, decided by `on_start`."""

    RUN = "run"
    """Run normally (and settle the record's command, if its outcome is not yet reported)."""
    PENDING = "pending"
    """Run upgrade-only until the first Welcome (CONFIRM) or the deadline (the rollback steps)."""
    ROLL_BACK = "roll-back"
    """Take the remaining rollback steps now, then restart (onto the old binary)."""
    FINISH_ROLLBACK = "finish-rollback"
    """The old binary runs with the record rolling-back: FAIL, then run normally and report the failure."""
    ABORT = "abort"
    """The switch never happened: ABORT, then run normally and report the command interrupted."""
    REFUSE = "refuse"
    """`current` names a slot below the floor: do not run."""


@dataclass(frozen=True)
class StartDecision:
    start: Start
    steps: tuple[Step, ...]
    """The steps to take before going on (in order)."""
    settle: tuple[str, str] | None = None
    """(outcome, reason) to report for `record.command_id` once the steps are done: ("succeeded", "") or
    ("failed", update-failed | interrupted); None: nothing to report."""
    why: str = ""


def on_start(disk: Disk, now: float) -> StartDecision:
    """What a process that starts on `disk.current` does, from the record and the link alone."""
    r = disk.record
    installed = r.slots.get(disk.current)
    if installed is not None and r.floor and installed.sequence < r.floor and r.state not in ("pending",):
        return StartDecision(
            Start.REFUSE,
            (),
            why=f"slot {disk.current} holds release {installed.version} (sequence {installed.sequence}),"
            f" below this node's release floor {r.floor}",
        )
    if r.state == "pending":
        if disk.current == r.from_slot:
            return StartDecision(Start.ABORT, (Step.ABORT,), ("failed", INTERRUPTED), "stopped before the switch")
        if now < r.deadline:
            return StartDecision(Start.PENDING, (), why="waiting for the first Welcome")
        return StartDecision(Start.ROLL_BACK, ROLLBACK, why="the confirmation deadline passed")
    if r.state == "rolling-back":
        if disk.current == r.to_slot:
            return StartDecision(Start.ROLL_BACK, ROLLBACK[1:], why="a rollback was under way")
        return StartDecision(Start.FINISH_ROLLBACK, (Step.FAIL,), ("failed", UPDATE_FAILED), "rolled back")
    if r.state == "failed" and r.command_id:
        return StartDecision(Start.RUN, (), ("failed", UPDATE_FAILED), "rolled back")
    if r.state == "aborted" and r.command_id:
        return StartDecision(Start.RUN, (), ("failed", INTERRUPTED), "stopped before the switch")
    if r.state == "confirmed" and r.command_id:
        return StartDecision(Start.RUN, (), ("succeeded", ""), "confirmed")
    return StartDecision(Start.RUN, ())


def run_steps(disk: Disk, steps: Sequence[Step], plan: Plan | None = None) -> Disk:
    for s in steps:
        disk = apply(disk, s, plan)
    return disk


def runnable(disk: Disk) -> bool:
    """The invariant every crash point keeps: `current` names a slot that holds a whole binary."""
    return disk.current in disk.slots


def disk_json(disk: Disk) -> dict[str, Any]:
    """The model as JSON: what `bc helper` answers after each step it takes for an unprivileged node."""
    return {
        "current": disk.current,
        "slots": sorted(disk.slots),
        "partial": disk.partial,
        "record": disk.record.to_json(),
    }


def disk_from_json(doc: Mapping[str, Any]) -> Disk:
    """`disk_json` read back; ValueError (or KeyError, TypeError) for a document that is not one."""
    current = str(doc["current"])
    slots = [str(s) for s in doc["slots"]]
    if current not in SLOTS or not set(slots) <= set(SLOTS):
        raise ValueError("the disk names an unknown slot")
    return Disk(
        current="a" if current == "a" else "b",
        slots=frozenset(s for s in SLOTS if s in slots),
        partial=bool(doc["partial"]),
        record=Record.from_json(doc["record"]),
    )
