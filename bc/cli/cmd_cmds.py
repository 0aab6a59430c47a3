"""`bc cmd`: run one-shot commands on a node, list them, show one, cancel one.

    bc cmd run NODE KIND [--payload JSON|@FILE] [--not-after 10m] [--min-generation G]
                         [--idempotency-key K] [--wait] [--json]
    bc cmd fanout KIND (--nodes n1,n2,… | --all) [--payload JSON|@FILE] [--not-after 10m]
                       [--min-generation G] [--idempotency-key K] [--wait] [--skip-away] [--json]
    bc cmd list [--node N] [--state S] [--limit N] [--json]
    bc cmd show ID [--json]
    bc cmd cancel ID [--reason R] [--json]

With `--json` a command prints as one object, `id` first, with the node's
result parsed (`result`: the result's JSON value, or null until it settles);
`cmd list --json` prints a list of them. `--wait` follows the command until it
settles, showing each state change on stderr, prints it, and exits 0 only
when it succeeded: any other outcome is `CommandFailed` (exit 8), so a script
can `bc cmd run … --wait && next-step`.

`fanout` queues KIND on many nodes in one `EnqueueCommands` call (all or
none; `bc.cli.fanout` follows them); `--json` prints a list of commands, and
with `--wait` it exits 0 only when every one succeeded.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from functools import partial
from typing import Any, TypeVar

import click

from bc.cli import fanout as fan
from bc.cli.admin_cmds import read_json_object
from bc.cli.connect import run_client, slow
from bc.cli.emit import emit
from bc.cli.output import Lines, echo, json_lines, lines
from bc.cli.render import (
    INT64_MAX,
    format_age,
    format_time_ms,
    message_to_json,
    parse_duration,
    render_fields,
    render_table,
)
from bc.client.admin import AdminClient
from bc.client.reconnect import retrying
from bc.control.commands.states import CANCELLED, STATES, SUCCEEDED, TERMINAL
from bc.errors import BcError, UsageError
from bc.protocol.pb import admin_pb2
from bc.seams.clock import SystemClock

_T = TypeVar("_T")
F = TypeVar("F", bound=Callable[..., Any])

POLL_S = 0.1
"""How often `--wait` asks for the command's state."""

json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")


class CommandFailed(BcError):
    """A waited-for command settled in a state other than `succeeded`."""

    exit_code = 8


# -- rendering ---------------------------------------------------------------------


def parse_result(result_json: str) -> Any:
    """The node's result as a JSON value; None until there is one; the raw text if it is not JSON."""
    if not result_json:
        return None
    try:
        return json.loads(result_json)
    except json.JSONDecodeError:
        return result_json  # base64 of a result that is not JSON: show it rather than hide it


def command_to_json(c: admin_pb2.CommandInfo) -> dict[str, Any]:
    """The command's proto fields in order (`id` first), with `result_json` replaced by the parsed `result`."""
    out: dict[str, Any] = {}
    for key, value in message_to_json(c).items():
        if key == "result_json":
            out["result"] = parse_result(c.result_json)
        else:
            out[key] = value
    return out


def _state(c: admin_pb2.CommandInfo) -> str:
    state = f"{c.state} ({c.reason})" if c.reason else c.state
    if c.cancel_requested and c.state not in TERMINAL:
        state += ", cancel requested"
    return state


def render_command(c: admin_pb2.CommandInfo) -> Lines:
    fields: list[tuple[str, object]] = [
        ("id", c.id),
        ("node", c.node_id),
        ("kind", c.kind),
        ("state", _state(c)),
        ("message", c.message),
        ("seq", c.seq),
        ("lane", c.lane),
        ("attempt", c.attempt),
        ("idempotency key", c.idempotency_key),
        ("not after", format_time_ms(c.not_after_ms) if c.not_after_ms else ""),
        ("min generation", c.min_generation),
        ("created", format_age(c.created_age_ms)),
        ("updated", format_age(c.updated_age_ms)),
        ("boot id", c.boot_id),
        ("batch", c.batch_id),
    ]
    text = render_fields(fields)
    result = parse_result(c.result_json)
    if result is not None:
        text = lines(text, "result", json_lines(result, sort_keys=True))
    return text


def _print(c: admin_pb2.CommandInfo, *, as_json: bool) -> None:
    emit(as_json, lambda: command_to_json(c), lambda: render_command(c))


# -- bc cmd ------------------------------------------------------------------------


@click.group("cmd")
def cmd() -> None:
    """One-shot commands on a node: run, list, show, cancel."""


def read_payload(kind: str, value: str) -> str:
    """The payload's JSON text from the argument, `@path` or `@-` (stdin), checked to be an object before any call."""
    return read_json_object(f"the {kind} payload", value) if value else ""


# The options `bc cmd run` and `bc cmd fanout` share: one command or many, asked the same way.
payload_option = click.option(
    "--payload", default="", metavar="JSON|@FILE", help="The kind's request as protobuf JSON (default {})."
)
min_generation_option = click.option(
    "--min-generation", type=click.IntRange(min=0, max=INT64_MAX), default=0, help="The spec generation it presupposes."
)


def not_after_option(what: str) -> Callable[[F], F]:
    return click.option(
        "--not-after",
        default="10m",
        show_default=True,
        help=f"How long {what} may wait to start: 90s, 10m, 1h, up to 7d.",
    )


@cmd.command("run")
@click.argument("node_id", metavar="NODE")
@click.argument("kind")
@payload_option
@not_after_option("the command")
@min_generation_option
@click.option("--idempotency-key", default="", help="Run at most once per node under this key (default: fresh).")
@click.option("--wait", is_flag=True, help="Follow it until it settles; exit non-zero unless it succeeds.")
@json_option
def cmd_run(
    node_id: str,
    kind: str,
    payload: str,
    not_after: str,
    min_generation: int,
    idempotency_key: str,
    wait: bool,
    as_json: bool,
) -> None:
    """Queue KIND on NODE; prints the command (with --wait, once it has settled)."""
    text = read_payload(kind, payload)
    not_after_s = parse_duration(not_after, what="--not-after")

    async def go(client: AdminClient) -> admin_pb2.CommandInfo:
        info = await slow(
            client,
            client.run_command(
                node_id,
                kind,
                payload_json=text,
                not_after_s=not_after_s,
                min_generation=min_generation,
                idempotency_key=idempotency_key,
            ),
        )
        return await wait_settled(client, info) if wait else info

    info = run_client(go)
    line = f"command {info.id}: {info.kind} on {info.node_id} (seq {info.seq}) {_state(info)}"
    emit(as_json, lambda: command_to_json(info), lambda: render_command(info) if wait else line)
    if wait and info.state != SUCCEEDED:
        raise CommandFailed(f"command {info.id} {info.state}" + (f": {info.reason}" if info.reason else ""))


async def wait_settled(client: AdminClient, info: admin_pb2.CommandInfo) -> admin_pb2.CommandInfo:
    """Poll until the command settles, showing `pending → dispatched → …` on stderr as it moves."""
    echo(f"{info.id}: {info.state}", err=True, nl=False)
    try:
        while info.state not in TERMINAL:
            await asyncio.sleep(POLL_S)
            now = await retrying(partial(client.get_command, info.id), SystemClock(), _say, client.server)
            if now.state != info.state:
                echo(f" → {now.state}", err=True, nl=False)
            info = now
    finally:
        echo("", err=True)
    return info


def _say(line: str) -> None:
    """A reconnect note, on a line of its own between the progress arrows."""
    echo(lines("", line), err=True)


@cmd.command("fanout")
@click.argument("kind")
@click.option("--nodes", "nodes_csv", default="", metavar="n1,n2,…", help="The nodes, comma-separated.")
@click.option("--all", "all_nodes", is_flag=True, help="Every node whose role runs KIND (not deleted or revoked).")
@payload_option
@not_after_option("each command")
@min_generation_option
@click.option(
    "--idempotency-key",
    default="",
    help="Each node runs it at most once under this key (default: fresh): a repeat queues nothing new.",
)
@click.option("--wait", is_flag=True, help="Follow them until all settle; exit non-zero unless all succeed.")
@click.option(
    "--skip-away", is_flag=True, help="Leave out the nodes that are new (never connected) or unreachable now."
)
@json_option
def cmd_fanout(
    kind: str,
    nodes_csv: str,
    all_nodes: bool,
    payload: str,
    not_after: str,
    min_generation: int,
    idempotency_key: str,
    wait: bool,
    skip_away: bool,
    as_json: bool,
) -> None:
    """Queue KIND on many nodes at once: all of them or, if one is refused, none."""
    if bool(nodes_csv) == all_nodes:
        raise UsageError("name the nodes with --nodes n1,n2,… or take them all with --all (one of the two)")
    named = fan.node_list(nodes_csv) if nodes_csv else []
    text = read_payload(kind, payload)
    not_after_s = parse_duration(not_after, what="--not-after")

    async def go(client: AdminClient) -> list[admin_pb2.CommandInfo]:
        nodes = await slow(client, client.list_nodes())
        node_ids = named or fan.runnable_nodes(nodes, kind)
        away = fan.away_nodes(nodes, node_ids)
        if away and skip_away:
            node_ids = [i for i in node_ids if i not in {n.node_id for n in away}]
        if not node_ids:
            raise UsageError(f"no node runs {kind}: nothing to queue")
        after = (await slow(client, client.server_info())).event_seq  # before the write: Watch misses nothing
        reqs = fan.requests(kind, node_ids, text, not_after_s, min_generation, idempotency_key)
        infos = await slow(client, client.enqueue_commands(reqs))
        if away:  # said once the fan-out is queued, before any wait: who will not answer, at once
            echo(fan.away_line(away, skipped=skip_away, not_after=not_after), err=True)
        if not wait:
            return infos
        infos = await fan.follow(client, kind, infos, after, pending_for_s=not_after_s + fan.PENDING_GRACE_S)
        unsettled = any(i.state not in TERMINAL for i in infos)
        return await fan.read_all(client, infos) if as_json or unsettled else infos

    infos = run_client(go)
    rows = [(c.id, c.node_id, c.seq, _state(c)) for c in infos]
    emit(
        as_json,
        lambda: [command_to_json(c) for c in infos],
        lambda: render_table(("ID", "NODE", "SEQ", "STATE"), rows),
    )
    why = fan.outcome(infos) if wait else ""
    if why:
        raise CommandFailed(why)


@cmd.command("list")
@click.option("--node", "node_id", default="", help="Only this node's commands.")
@click.option("--state", type=click.Choice(STATES), default=None, help="Only commands in this state.")
@click.option("--limit", type=click.IntRange(min=1, max=1000), default=None, help="At most this many (default 100).")
@json_option
def cmd_list(node_id: str, state: str | None, limit: int | None, as_json: bool) -> None:
    """Commands, newest first."""
    items = run_client(lambda c: slow(c, c.list_commands(node_id=node_id, state=state or "", limit=limit or 0)))
    rows = [(c.id, c.node_id, c.kind, c.state, c.reason, format_age(c.created_age_ms)) for c in items]
    emit(
        as_json,
        lambda: [command_to_json(c) for c in items],
        lambda: render_table(("ID", "NODE", "KIND", "STATE", "REASON", "AGE"), rows),
        empty="no commands",
    )


@cmd.command("show")
@click.argument("command_id", metavar="ID")
@json_option
def cmd_show(command_id: str, as_json: bool) -> None:
    """One command: its state, reason, timing and the node's result."""
    _print(run_client(lambda c: slow(c, c.get_command(command_id))), as_json=as_json)


@cmd.command("cancel")
@click.argument("command_id", metavar="ID")
@click.option("--reason", default="", help="Why; the node is told (default: cancelled by the operator).")
@json_option
def cmd_cancel(command_id: str, reason: str, as_json: bool) -> None:
    """Cancel a command: at once if not yet sent, else the node is asked to stop."""
    info = run_client(lambda c: slow(c, c.cancel_command(command_id, reason=reason)))
    emit(as_json, lambda: command_to_json(info), _cancelled(info))


def _cancelled(info: admin_pb2.CommandInfo) -> str:
    if info.state not in TERMINAL:
        return f"command {info.id}: cancel requested; it is {info.state}, the node will be told"
    if info.state == CANCELLED:
        return f"command {info.id}: cancelled" + (f" ({info.reason})" if info.reason != "cancelled" else "")
    return f"command {info.id}: already {_state(info)}; nothing to cancel"


COMMANDS: tuple[click.Command, ...] = (cmd,)

__all__ = ["COMMANDS", "CommandFailed", "cmd", "command_to_json", "render_command", "wait_settled"]
