"""`bc cmd fanout`: one kind to many nodes in one `EnqueueCommands` call, and the wait that follows them.

The call is all or nothing: the server stores every command or none (a node
that does not exist, a bad payload: one sentence naming the member, exit 2 or
3). `--wait` then follows the events log (Admin `Watch`, from the event seq
read before the call, so no change is missed) until every command has
settled, with a progress line on stderr at most once a second:

    inventory.refresh on 100 nodes: 2 pending, 11 running, 87 succeeded

`--wait --json` reads each command once at the end (`GetCommand`, a few at a
time), so every object is what `bc cmd show ID --json` prints.

Nodes that are away when the fan-out is queued (`new`: never connected;
`unreachable`) are named on stderr at once (`away_line`): their commands wait
for them until `--not-after`. `--skip-away` leaves them out instead. `--wait`
stops waiting for a command still `pending` (never sent) once its `not_after`
has passed (plus one sweeper pass, `PENDING_GRACE_S`, by which the sweeper has
marked it `expired`), so a node that never connects costs `--not-after`, not
forever; the table then shows each command's state as the server has it.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterable

from bc.cli.output import echo
from bc.cli.render import format_span
from bc.client.admin import AdminClient
from bc.client.reconnect import follow_events
from bc.control.commands.states import STATES, SUCCEEDED, TERMINAL
from bc.errors import ProtocolError, UsageError
from bc.protocol import kinds
from bc.protocol.pb import admin_pb2
from bc.seams.clock import SystemClock

PROGRESS_EVERY_S = 1.0
"""At most one progress line a second (and always the last one)."""

PENDING_GRACE_S = 6.0
"""After `not_after`, how long `--wait` still waits for a pending command: the sweeper's pass (5 s) that
settles it `expired`."""

AWAY_STATES = ("new", "unreachable")
"""Node states whose commands wait in `pending` until the node connects (or their `not_after`)."""

READ_CONCURRENCY = 16
"""`GetCommand` calls in flight at once when `--wait --json` reads the settled commands."""


def node_list(csv: str) -> list[str]:
    """`--nodes n1,n2,…`: no empty name, no node twice (each node gets one command)."""
    items = [v.strip() for v in csv.split(",")]
    if not csv.strip() or any(not v for v in items):
        raise UsageError(f"--nodes must be a comma-separated list with no empty names, not {csv!r}")
    seen: set[str] = set()
    for node_id in items:
        if node_id in seen:
            raise UsageError(f"{node_id} appears twice in --nodes; each node gets one command")
        seen.add(node_id)
    return items


def runnable_nodes(nodes: Iterable[admin_pb2.NodeInfo], kind: str) -> list[str]:
    """`--all`: every node that is not deleted or revoked and whose role runs `kind` (all of them for a
    kind this CLI does not know: the server then names it)."""
    k = kinds.get(kind)
    return sorted(
        n.node_id for n in nodes if n.state != "deleted" and not n.revoked and (k is None or n.role in k.roles)
    )


def away_nodes(nodes: Iterable[admin_pb2.NodeInfo], node_ids: Iterable[str]) -> list[admin_pb2.NodeInfo]:
    """Of `node_ids`, the nodes that are away now (`new` or `unreachable`), in `node_ids`' order."""
    by_id = {n.node_id: n for n in nodes}
    return [by_id[i] for i in node_ids if i in by_id and by_id[i].state in AWAY_STATES]


def _away_one(n: admin_pb2.NodeInfo) -> str:
    if n.state == "new":
        return f"{n.node_id} (new: never connected)"
    since = f" for {format_span(n.state_age_ms)}" if n.state_age_ms > 0 else ""
    return f"{n.node_id} (unreachable{since})"


def away_line(away: list[admin_pb2.NodeInfo], *, skipped: bool, not_after: str) -> str:
    """What `bc cmd fanout` says on stderr about the nodes that are away, once queued and before any wait."""
    names = ", ".join(_away_one(n) for n in away)
    count = f"{len(away)} node{'s' if len(away) != 1 else ''}"
    if skipped:
        return f"skipping {count} away (--skip-away): {names}"
    return (
        f"{count} away: {names}; their commands wait for them until --not-after ({not_after}), "
        "--skip-away leaves them out"
    )


def requests(
    kind: str, node_ids: list[str], payload_json: str, not_after_s: int, min_generation: int, idempotency_key: str
) -> list[admin_pb2.RunCommandRequest]:
    return [
        admin_pb2.RunCommandRequest(
            node_id=node_id,
            kind=kind,
            payload_json=payload_json,
            not_after_s=not_after_s,
            min_generation=min_generation,
            idempotency_key=idempotency_key,
        )
        for node_id in node_ids
    ]


def progress_line(kind: str, infos: Iterable[admin_pb2.CommandInfo]) -> str:
    """`KIND on N nodes: 2 pending, 11 running, 87 succeeded` (states in their lifecycle order)."""
    counts = Counter(i.state for i in infos)
    total = sum(counts.values())
    parts = [f"{counts[s]} {s}" for s in STATES if counts[s]]
    return f"{kind} on {total} node{'s' if total != 1 else ''}: " + ", ".join(parts)


def outcome(infos: list[admin_pb2.CommandInfo]) -> str:
    """Empty when every command succeeded; else the sentence `bc cmd fanout --wait` fails with."""
    bad = [i for i in infos if i.state != SUCCEEDED]
    if not bad:
        return ""
    counts = Counter(i.state for i in bad)
    first = bad[0]
    why = f"{first.state} ({first.reason})" if first.reason else first.state
    states = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
    head = f"{len(bad)} of {len(infos)} commands did not succeed ({states})"
    return f"{head}; the first, {first.id} on {first.node_id}: {why}"


async def _next(stream: AsyncIterator[admin_pb2.EventRecord]) -> admin_pb2.EventRecord | None:
    try:
        return await anext(stream)
    except StopAsyncIteration:
        return None


def _apply(by_id: dict[str, admin_pb2.CommandInfo], open_ids: set[str], ev: admin_pb2.EventRecord) -> None:
    """A `command.updated` or `command.settled` event of one of ours: its new state (and reason)."""
    info = by_id.get(ev.subject)
    if info is None or info.state in TERMINAL or ev.type not in ("command.updated", "command.settled"):
        return
    data = json.loads(ev.data_json)
    state = str(data.get("state", ""))
    if state not in STATES:
        return
    info.state = state
    if ev.type == "command.settled":
        info.reason = str(data.get("reason", ""))
        open_ids.discard(info.id)


async def follow(
    client: AdminClient,
    kind: str,
    infos: list[admin_pb2.CommandInfo],
    after_seq: int,
    show: Callable[[str], None] = lambda line: echo(line, err=True),
    pending_for_s: float | None = None,
) -> list[admin_pb2.CommandInfo]:
    """Follow `infos` through the events log from `after_seq` until every one has settled, calling `show`
    with a progress line at most once a second (and with the last one).

    States and reasons come from the `command.updated` / `command.settled` events; the rest of each
    command is as the enqueue reply had it. `pending_for_s`: after this long, a command still `pending`
    is no longer waited for (its not_after has passed: it will never be sent); the caller reads its state.
    """
    by_id = {i.id: i for i in infos}
    open_ids = {i.id for i in infos if i.state not in TERMINAL}
    if not open_ids:
        show(progress_line(kind, infos))
        return infos
    loop = asyncio.get_running_loop()
    give_up_at = None if pending_for_s is None else loop.time() + pending_for_s
    # Across a `bc serve` restart: resumed after the last event read, each event once.
    stream = follow_events(client, SystemClock(), show, after_seq=after_seq, type_prefix="command.")
    shown, shown_at = "", float("-inf")
    pending = asyncio.ensure_future(_next(stream))
    try:
        while True:
            if give_up_at is not None and loop.time() >= give_up_at:
                open_ids -= {i for i in open_ids if by_id[i].state == "pending"}  # past not_after: never sent
            line = progress_line(kind, infos)
            if line != shown and (not open_ids or loop.time() - shown_at >= PROGRESS_EVERY_S):
                show(line)
                shown, shown_at = line, loop.time()
            if not open_ids:
                return infos
            wait = None if line == shown else max(0.0, shown_at + PROGRESS_EVERY_S - loop.time())
            if give_up_at is not None and any(by_id[i].state == "pending" for i in open_ids):
                until = max(0.0, give_up_at - loop.time())
                wait = until if wait is None else min(wait, until)
            done, _ = await asyncio.wait({pending}, timeout=wait)
            if pending in done:
                ev = pending.result()
                if ev is None:
                    raise ProtocolError("the server ended the events stream before every command settled")
                _apply(by_id, open_ids, ev)
                pending = asyncio.ensure_future(_next(stream))
    finally:
        pending.cancel()
        await asyncio.gather(pending, return_exceptions=True)  # retrieves its outcome, whatever it was
        await stream.aclose()


async def read_all(client: AdminClient, infos: list[admin_pb2.CommandInfo]) -> list[admin_pb2.CommandInfo]:
    """Each command as `GetCommand` has it now (its result, message, timing), a few calls at a time."""
    gate = asyncio.Semaphore(READ_CONCURRENCY)

    async def one(command_id: str) -> admin_pb2.CommandInfo:
        async with gate:
            return await client.get_command(command_id)

    return list(await asyncio.gather(*(one(i.id) for i in infos)))


__all__ = [
    "away_line",
    "away_nodes",
    "follow",
    "node_list",
    "outcome",
    "progress_line",
    "read_all",
    "requests",
    "runnable_nodes",
]
