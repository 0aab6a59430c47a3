"""The journal's rules, as pure functions over journal rows.

Nothing here does I/O or reads a clock: time comes in as `now`, the process
comes in as its `incarnation_id` and the kernel boot as its `boot_id`. The
SQLite journal (`agent.journal`) and the in-memory one
(`agent.memory_journal`) both apply these rules, so the simulator, the
property tests and the real agent cannot disagree (reference: "The journal",
"Duplicates and crash recovery"; failure modes: "Daemon crash or node reboot").

The theory
----------
Every process start picks a fresh incarnation id. A journal entry written by
another incarnation belongs to a process that no longer exists, so nothing
can re-attach to it. The one write that makes crash recovery possible is
`accepted`, fsynced before any side effect starts: a command is either known
to the journal before it could have done anything, or it never ran.
Self-terminating kinds (`node.reboot`, `boot.kexec`, `daemon.upgrade`) also
write `running{boot_id}` immediately before their side effect, so the next
boot can tell the reboot they caused (new `boot_id`) from a crash (same one).

`resolve` -- a delivered command against its journal entry:

=========================================  ===========  =====================================
Journal entry                              Resolution   What the caller does
=========================================  ===========  =====================================
none                                       EXECUTE      acceptance checks, `accepted`, run
`done`                                     RESEND       send the stored result bytes again
`accepted`/`running`, this incarnation     REATTACH     the execution in flight reports
`running`, self-terminating, earlier boot  REBOOTED     SUCCEEDED `rebooted`, never run again
earlier process, retry-safe                REEXECUTE    acceptance checks again, then run
earlier process, not retry-safe            INTERRUPTED  FAILED `interrupted`
=========================================  ===========  =====================================

A self-terminating `running` entry of the *same* boot left by an earlier
process means the process died before the reboot: it is judged by its
retry-safety like any other entry. An `accepted` self-terminating entry never
counts as rebooted: its side effect had not started.

`recover` -- at start, settle what needs no server input: REBOOTED entries
become `rebooted`, INTERRUPTED ones `interrupted`, so both go out in
`Hello.unacked_results`. Retry-safe entries wait for redelivery, so a
re-execution passes the `not_after` and `min_generation` checks again.

`sweep` -- done entries older than 7 days go, and so do accepted or running
entries an earlier process left that nothing redelivered within 7 days (the
server has long expired them). In-flight entries of the running process never
go, however old: its own execution will still settle them. A done entry goes
by age whichever process wrote it, so a process that stays up for weeks does
not grow the journal without end (no redelivery arrives 7 days late: the
server expires commands within hours).

Bounds -- at most `MAX_EVENTS` unacked events and `MAX_BYTES` of their
payloads; configuration may lower both, never raise them. Events are classed
metric, transition or result. To admit new events the oldest metric events
are dropped; results and transitions never are. When even that is not enough
nothing is dropped, the new events are refused, and new commands get `BUSY`
until acks drain the backlog.

Sizes (`bc.protocol.limits`) -- a node must never hold what it cannot send.
`fit_update` is applied to every terminal update before it is journaled and
before it is signed: a result over `max_result_bytes` becomes FAILED
`result-too-large` (the message and a small JSON result give its size and the
outcome the kind reported), and a reason or message over `max_text_bytes` is
cut. `fit_event` does the same for an event over `max_event_bytes`: it is
journaled as `event.too-large` (a transition, never dropped) naming its type
and size. `refit` finds the done entries an older agent journaled over the
limits; the agent settles them at start, so they go out at its next Hello.

The command transitions (`accept_entry`, `running_entry`, `done_entry`) are
here too, so both stores refuse the same illegal moves: a done entry is never
re-accepted and its result never replaced (every duplicate must get the same
bytes), and only the incarnation that accepted an entry may mark it running.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal, Protocol

from bc.protocol.canonical import canonical_json
from bc.protocol.limits import LIMITS, Limits, text_size, truncate_text
from bc.protocol.pb import session_pb2

CommandState = Literal["accepted", "running", "done"]
COMMAND_STATES: tuple[CommandState, ...] = ("accepted", "running", "done")

KEEP_S = 7 * 86400
MAX_EVENTS = 10_000
MAX_BYTES = 64 * 1024 * 1024

METRIC = session_pb2.METRIC
TRANSITION = session_pb2.TRANSITION
RESULT = session_pb2.RESULT


class UnknownCommand(LookupError):
    """A transition named a command the journal does not hold."""


class CommandConflict(Exception):
    """A transition the rules forbid: re-accepting a done entry, running another process's entry."""


@dataclass(frozen=True)
class CommandEntry:
    command_id: str
    kind: str
    state: CommandState
    incarnation_id: str  # the process that wrote it
    boot_id: str  # the kernel boot of the process that wrote it
    retry_safe: bool
    self_terminating: bool
    updated_at: float  # host wall seconds
    result: bytes | None  # a serialized terminal CommandUpdate when done
    acked: bool


# -- duplicates ---------------------------------------------------------------


class Resolution(enum.Enum):
    EXECUTE = "execute"
    RESEND = "resend"
    REATTACH = "reattach"
    REBOOTED = "rebooted"
    REEXECUTE = "reexecute"
    INTERRUPTED = "interrupted"


def resolve(entry: CommandEntry | None, incarnation_id: str, boot_id: str) -> Resolution:
    """What to do with a delivered command, given its journal entry (the module's first table)."""
    if entry is None:
        return Resolution.EXECUTE
    if entry.state == "done":
        return Resolution.RESEND
    if entry.incarnation_id == incarnation_id:
        return Resolution.REATTACH
    if entry.state == "running" and entry.self_terminating and entry.boot_id != boot_id:
        return Resolution.REBOOTED
    return Resolution.REEXECUTE if entry.retry_safe else Resolution.INTERRUPTED


# -- crash recovery -----------------------------------------------------------


@dataclass(frozen=True)
class Settlement:
    command_id: str
    outcome: Literal["rebooted", "interrupted"]
    previous_boot_id: str  # the boot the entry was written in (NodeRebootResult.previous_boot_id)


def recover(entries: Iterable[CommandEntry], incarnation_id: str, boot_id: str) -> list[Settlement]:
    """The entries of earlier processes whose outcome needs no server input, oldest first."""
    out: list[Settlement] = []
    for e in sorted(entries, key=lambda e: (e.updated_at, e.command_id)):
        if e.state == "done" or e.incarnation_id == incarnation_id:
            continue
        r = resolve(e, incarnation_id, boot_id)
        if r is Resolution.REBOOTED:
            out.append(Settlement(e.command_id, "rebooted", e.boot_id))
        elif r is Resolution.INTERRUPTED:
            out.append(Settlement(e.command_id, "interrupted", e.boot_id))
    return out


def sweep(entries: Iterable[CommandEntry], now: float, incarnation_id: str, keep_s: float = KEEP_S) -> list[str]:
    """Ids to delete: done entries, and in-flight entries earlier processes left, older than `keep_s`."""
    out: list[str] = []
    for e in entries:
        if now - e.updated_at <= keep_s:
            continue
        if e.state == "done" or e.incarnation_id != incarnation_id:
            out.append(e.command_id)
    return out


# -- transitions --------------------------------------------------------------


@dataclass(frozen=True)
class Acceptance:
    """One command's `accepted`, as the dispatcher asks a journal for it: every store, and every journal that
    wraps one (the simulator's), takes this one value rather than its eight fields."""

    command_id: str
    kind: str
    retry_safe: bool
    self_terminating: bool
    incarnation_id: str  # the process accepting it
    boot_id: str  # the kernel boot it is accepted in
    body: bytes  # the command's body, kept for a re-execution's acceptance checks
    now: float  # host wall seconds


def accept_entry(existing: CommandEntry | None, a: Acceptance) -> CommandEntry:
    """`accepted` for a new command, or for a retry-safe re-execution taking over an earlier process's entry."""
    if existing is not None:
        if existing.state == "done":
            raise CommandConflict(f"command {a.command_id} is done; its stored result is resent, never re-run")
        if existing.incarnation_id == a.incarnation_id:
            raise CommandConflict(f"command {a.command_id} is already in flight in this process")
    return CommandEntry(
        command_id=a.command_id,
        kind=a.kind,
        state="accepted",
        incarnation_id=a.incarnation_id,
        boot_id=a.boot_id,
        retry_safe=a.retry_safe,
        self_terminating=a.self_terminating,
        updated_at=a.now,
        result=None,
        acked=False,
    )


def running_entry(existing: CommandEntry | None, incarnation_id: str, boot_id: str, now: float) -> CommandEntry:
    """`running{boot_id}`: only the incarnation that accepted the entry may start its side effect."""
    if existing is None:
        raise UnknownCommand("no journal entry: accept the command before running it")
    if existing.state == "done":
        raise CommandConflict(f"command {existing.command_id} is done")
    if existing.incarnation_id != incarnation_id:
        raise CommandConflict(f"command {existing.command_id} was accepted by another process")
    return replace(existing, state="running", boot_id=boot_id, updated_at=now)


def done_entry(existing: CommandEntry, update: bytes, now: float) -> CommandEntry | None:
    """`done` with its terminal update; None when it is done already (the first result stands)."""
    if existing.state == "done":
        return None
    return replace(existing, state="done", result=update, acked=False, updated_at=now)


def settled_entries(
    settlements: Sequence[Settlement], existing: Mapping[str, CommandEntry], updates: Mapping[str, bytes], now: float
) -> list[CommandEntry]:
    """The `done` entries `recover`'s settlements make with their (fitted) updates: what both journals'
    `apply_settlements` write. KeyError when a settlement has no update; an entry gone, done already or
    named twice makes none (the first result stands)."""
    missing = [s.command_id for s in settlements if s.command_id not in updates]
    if missing:
        raise KeyError(f"no update for settlements {missing}")
    out: dict[str, CommandEntry] = {}
    for s in settlements:
        entry = existing.get(s.command_id)
        done = None if entry is None or s.command_id in out else done_entry(entry, updates[s.command_id], now)
        if done is not None:
            out[s.command_id] = done
    return list(out.values())


def rejected_entry(
    command_id: str, kind: str, update: bytes, incarnation_id: str, boot_id: str, now: float
) -> CommandEntry:
    """A terminal rejection of a command never accepted: journaled so a duplicate gets the same answer."""
    return CommandEntry(
        command_id=command_id,
        kind=kind,
        state="done",
        incarnation_id=incarnation_id,
        boot_id=boot_id,
        retry_safe=False,
        self_terminating=False,
        updated_at=now,
        result=update,
        acked=False,
    )


def unacked(entries: Iterable[CommandEntry]) -> list[tuple[str, bytes]]:
    """Done, unacked results in the order they were settled: what `Hello.unacked_results` replays."""
    out: list[tuple[str, bytes]] = []
    for e in sorted(entries, key=lambda e: (e.updated_at, e.command_id)):
        if e.state == "done" and not e.acked and e.result is not None:
            out.append((e.command_id, e.result))
    return out


# -- event bounds -------------------------------------------------------------


@dataclass(frozen=True)
class EventRow:
    seq: int
    event_class: int  # session_pb2.EventClass: METRIC, TRANSITION, RESULT
    size: int  # payload bytes


@dataclass(frozen=True)
class BoundsPlan:
    drop: list[int]  # seqs of metric events to delete, oldest first
    admit: bool


def within_bounds(count: int, size: int, max_events: int, max_bytes: int) -> bool:
    """`count` events of `size` payload bytes in all fit the bounds."""
    return count <= max_events and size <= max_bytes


def plan_bounds(
    events: Sequence[EventRow], incoming: Sequence[EventRow], max_events: int, max_bytes: int
) -> BoundsPlan:
    """Which metric events to drop, oldest first, so `incoming` fits; admit=False (dropping nothing) if it cannot."""
    in_count, in_bytes = len(incoming), sum(e.size for e in incoming)
    count, size = len(events) + in_count, sum(e.size for e in events) + in_bytes
    if within_bounds(count, size, max_events, max_bytes):
        return BoundsPlan(drop=[], admit=True)
    metrics = sorted((e for e in events if e.event_class == METRIC), key=lambda e: e.seq)
    if not within_bounds(count - len(metrics), size - sum(e.size for e in metrics), max_events, max_bytes):
        return BoundsPlan(drop=[], admit=False)
    drop: list[int] = []
    for m in metrics:
        if within_bounds(count, size, max_events, max_bytes):
            break
        drop.append(m.seq)
        count, size = count - 1, size - m.size
    return BoundsPlan(drop=drop, admit=True)


def is_full(events: Sequence[EventRow], max_events: int, max_bytes: int) -> bool:
    """At a bound even after dropping every metric: new commands get BUSY until acks drain it."""
    kept = [e for e in events if e.event_class != METRIC]
    return at_bound(len(kept), sum(e.size for e in kept), max_events, max_bytes)


def at_bound(undroppable_count: int, undroppable_bytes: int, max_events: int, max_bytes: int) -> bool:
    """`is_full` over totals of the events that cannot be dropped (a store may sum them in SQL)."""
    return undroppable_count >= max_events or undroppable_bytes >= max_bytes


def clamp_bounds(configured_events: int | None, configured_bytes: int | None) -> tuple[int, int]:
    """The bounds in force: config (None = unset) may lower the built-in ones, never raise them."""
    out: list[int] = []
    for name, value, ceiling in (("events", configured_events, MAX_EVENTS), ("bytes", configured_bytes, MAX_BYTES)):
        if value is None:
            out.append(ceiling)
        elif value < 1:
            raise ValueError(f"journal max {name} must be at least 1, not {value}")
        else:
            out.append(min(value, ceiling))
    return out[0], out[1]


# -- sizes --------------------------------------------------------------------

RESULT_TOO_LARGE = "result-too-large"
EVENT_TOO_LARGE = "event.too-large"


def fit_update_message(update: session_pb2.CommandUpdate, limits: Limits = LIMITS) -> session_pb2.CommandUpdate:
    """`update` as it may be journaled and sent: the same object when it fits, else a fitted copy."""
    result_fits = len(update.result) <= limits.max_result_bytes
    texts_fit = text_size(update.reason) <= limits.max_text_bytes and text_size(update.message) <= limits.max_text_bytes
    if result_fits and texts_fit:
        return update
    out = session_pb2.CommandUpdate()
    out.CopyFrom(update)
    if not result_fits:
        outcome = session_pb2.CommandState.Name(update.state).removeprefix("COMMAND_").lower()
        size = len(update.result)
        out.state = session_pb2.COMMAND_FAILED
        out.reason = RESULT_TOO_LARGE
        out.message = (
            f"the result is {size:,} bytes; the limit is {limits.max_result_bytes:,} bytes (max_result_bytes);"
            f" the command itself ended {outcome}" + (f" ({update.reason})" if update.reason else "")
        )
        summary = {
            "result_bytes": size,
            "max_result_bytes": limits.max_result_bytes,
            "outcome": outcome,
            "outcome_reason": truncate_text(update.reason, limits.max_text_bytes),
        }
        out.result = canonical_json(summary).encode()
        out.ClearField("node_sig")  # a signature covered the result that is no longer here
    out.reason = truncate_text(out.reason, limits.max_text_bytes)
    out.message = truncate_text(out.message, limits.max_text_bytes)
    return out


def fit_update(update: bytes, limits: Limits = LIMITS) -> bytes:
    """A serialized terminal update as it may be journaled: the same bytes when it fits (a duplicate gets them)."""
    if len(update) <= limits.max_text_bytes:
        return update  # nothing in it can be over a limit
    msg = session_pb2.CommandUpdate.FromString(update)
    fitted = fit_update_message(msg, limits)
    return update if fitted is msg else fitted.SerializeToString()


def refit(entries: Iterable[CommandEntry], limits: Limits = LIMITS) -> list[CommandEntry]:
    """Done entries (an older agent's) whose update is over the limits, with the fitted update in their place."""
    out: list[CommandEntry] = []
    for e in entries:
        if e.state == "done" and e.result is not None:
            fitted = fit_update(e.result, limits)
            if fitted != e.result:
                out.append(replace(e, result=fitted))
    return out


def fit_event(type_: str, event_class: int, payload: bytes, limits: Limits = LIMITS) -> tuple[str, int, bytes]:
    """A journal event as it may be journaled: over `max_event_bytes`, an `event.too-large` transition in its place.

    `payload` is a serialized NodeEvent. The replacement names the type and the size, so the operator sees
    what was dropped (the gateway publishes it as `node.event-too-large`); it is a transition, never dropped.
    """
    if len(payload) <= limits.max_event_bytes:
        return type_, event_class, payload
    body = {"type": truncate_text(type_, 256), "bytes": len(payload), "max_event_bytes": limits.max_event_bytes}
    ev = session_pb2.NodeEvent(type=EVENT_TOO_LARGE, body=canonical_json(body).encode())
    return EVENT_TOO_LARGE, TRANSITION, ev.SerializeToString()


# -- the store contract -------------------------------------------------------


class CommandStore(Protocol):
    """The command half of a journal: `agent.journal.Journal` on disk, `MemoryJournal` in memory."""

    async def get_command(self, command_id: str) -> CommandEntry | None: ...

    async def command_body(self, command_id: str) -> bytes | None: ...

    async def accept(self, a: Acceptance) -> None: ...

    async def mark_running(self, command_id: str, incarnation_id: str, boot_id: str, now: float) -> None: ...

    async def finish(self, command_id: str, update: bytes, now: float) -> bool: ...

    async def record_done(
        self, command_id: str, kind: str, update: bytes, incarnation_id: str, boot_id: str, now: float
    ) -> bool: ...

    async def unacked_results(self) -> list[tuple[str, bytes]]: ...

    async def ack_results(self, command_ids: Iterable[str]) -> int: ...

    async def commands(self) -> list[CommandEntry]: ...

    async def delete_commands(self, command_ids: Iterable[str]) -> int: ...

    async def apply_settlements(
        self, settlements: Sequence[Settlement], updates: Mapping[str, bytes], now: float
    ) -> int: ...

    async def sweep_commands(self, now: float, incarnation_id: str, keep_s: float = KEEP_S) -> list[str]: ...

    async def settle_oversized(self) -> list[CommandEntry]: ...
