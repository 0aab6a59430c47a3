"""Capacity commands (issue 13, docs/capacity.md): reserve, reservations, reservation show, capacity explain,
usage.

Times are converted here, on the CLI host, to absolute milliseconds: `--start 20:00` is the next 20:00 in
this host's local time, an ISO time with a zone (`2026-12-02T20:00Z`) is taken as written. Everything is
printed through `bc.cli.output`.
"""

from __future__ import annotations

import csv
import io
import re
from datetime import UTC, datetime
from functools import partial

import click

from bc.cli import times
from bc.cli.admin_cmds import call_admin, json_option
from bc.cli.csv_cells import csv_row
from bc.cli.emit import emit
from bc.cli.output import Lines, echo, lines
from bc.cli.render import format_age, render_table
from bc.client.admin import AdminClient
from bc.client.reconnect import follow_events, retrying
from bc.errors import UsageError
from bc.protocol import usage_units as units
from bc.protocol.limits import LIMITS, check_name, check_range
from bc.protocol.pb import admin_pb2
from bc.seams.clock import SystemClock

_SIZES = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
SETTLED = ("active", "failed", "ended", "released", "lost")


def _local_now() -> datetime:
    """Now on the CLI host's clock (the production clock seam), in its local time zone."""
    return datetime.fromtimestamp(SystemClock().now(), tz=UTC).astimezone()


def parse_duration(text: str) -> int:
    """'12h', '90m', '1h30m', '45s', '2d' -> milliseconds, at most `max_duration_ms` (`bc.cli.times`)."""
    return times.duration_ms(text, what="--duration")


def parse_size(text: str) -> int:
    """'128G', '512M', '1T', '1073741824' -> bytes (binary units), at most `max_memory_bytes`."""
    m = re.fullmatch(r"(\d{1,20})\s*([bkmgt]?)(?:i?b)?", text.strip().lower())
    if m is None:
        raise UsageError(f"{text!r} is not a size; write it like 128G or 512M")
    size = int(m.group(1)) * _SIZES[m.group(2)]
    check_range("--memory (bytes)", size, 0, "max_memory_bytes")
    return size


def parse_time(text: str, now: datetime | None = None, *, what: str = "--start") -> int:
    """A time ahead (`--start`, a window's `--until`) -> epoch ms: `bc.cli.times` reads every form."""
    return times.parse_instant(text, now or _local_now(), toward=times.Toward.AHEAD, what=what)


def say_when(option: str, text: str, at_ms: int, now: datetime | None = None) -> None:
    """A time that lands on another day is printed (stderr) with its date and how far away it is (issue 30)."""
    where = times.lands_elsewhere(at_ms, now or _local_now())
    if where is not None:
        echo(f"note: {option} {text} is {where}", err=True)


def parse_selector(items: tuple[str, ...]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in (p for raw in items for p in raw.split(",")):
        k, sep, v = item.partition("=")
        if not sep or not k.strip() or not v.strip():
            raise UsageError(f"a selector is key=value, not {item!r}")
        out[k.strip()] = v.strip()
    return out


def iso_ms(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ") if ms else "-"


def _summary(r: admin_pb2.Reservation) -> str:
    """'reservation R on n1: gpu/0, gpu/1' once it has devices; else its state and why."""
    atoms = [d.atom_id or d.gpu_uuid for d in r.devices]
    if atoms and r.state not in ("pending", "ended", "failed", "released"):
        return f"reservation {r.id} on {r.node_id or '-'}: {', '.join(atoms)}"
    where = r.node_id or r.want_node_id or "-"
    return f"reservation {r.id} on {where}: {r.state}" + (f": {r.reason}" if r.reason else "")


def _change(r: admin_pb2.Reservation) -> str:
    """One line per state change under --wait: 'reservation R pending on n1: starts at T'."""
    where = f" on {r.node_id}" if r.node_id else ""
    return f"reservation {r.id} {r.state}{where}" + (f": {r.reason}" if r.reason else "")


def _say(line: str) -> None:
    echo(line, err=True)


async def _wait(c: AdminClient, first: admin_pb2.Reservation, *, quiet: bool) -> admin_pb2.Reservation:
    """Print each state change of the reservation until it is active or settled otherwise."""
    # Watch from now, not from the store's first event: read the newest seq, then the reservation again,
    # so a change between the two reads is both in the state read and after the seq watched.
    after = (await c.server_info()).event_seq
    r = await c.get_reservation(first.id)
    last = (first.state, first.reason)
    if (r.state, r.reason) != last:
        last = (r.state, r.reason)
        if not quiet:
            echo(_change(r))
    if r.state in SETTLED:
        return r
    clock = SystemClock()
    # Across a `bc serve` restart: the events resume after the last one read, the read is tried again.
    async for ev in follow_events(c, clock, _say, after_seq=after, type_prefix="reservation."):
        if ev.subject != first.id:
            continue
        r = await retrying(partial(c.get_reservation, first.id), clock, _say, c.server)
        if (r.state, r.reason) != last:
            last = (r.state, r.reason)
            if not quiet:
                echo(_change(r))
        if r.state in SETTLED:
            break
    return r


@click.command("reserve")
@click.option(
    "--gpus", type=click.IntRange(min=1, max=LIMITS.max_gpus), required=True, help="How many devices to book."
)
@click.option("--node", "node_id", default="", help="The node to book on (default: any with free capacity).")
@click.option(
    "--class", "device_class", type=click.Choice(["gpu", "gpu.mig", "gpu.slot"]), default="gpu", show_default=True
)
@click.option("--start", default="", help="When the window starts: now, +10m, 20:00 (next, local), 2026-12-02T20:00Z.")
@click.option("--duration", default="", help="How long it lasts: 12h, 90m, 1h30m (default: until released).")
@click.option("--until", "until", default="", help="When the window ends (instead of --duration).")
@click.option(
    "--cpus", type=click.IntRange(min=0, max=LIMITS.max_cpus), default=0, help="CPUs to book next to the GPUs."
)
@click.option("--memory", default="", help="Memory to book next to the GPUs: 128G, 512M.")
@click.option(
    "--hugepages-1g",
    "hugepages_1g",
    type=click.IntRange(min=0, max=LIMITS.max_hugepages_1g),
    default=0,
    help="1 GiB huge pages.",
)
@click.option("--binding", type=click.Choice(["hold", "kubernetes", "instance"]), default="hold", show_default=True)
@click.option("--tenant", default="", help="Who the reservation is for (billing).")
@click.option("--selector", multiple=True, help="Node labels it needs: pool=a100 (repeat or comma-separate).")
@click.option("--wait", "wait", is_flag=True, help="Block, printing its state changes, until active or failed.")
@json_option
def reserve(
    gpus: int,
    node_id: str,
    device_class: str,
    start: str,
    duration: str,
    until: str,
    cpus: int,
    memory: str,
    hugepages_1g: int,
    binding: str,
    tenant: str,
    selector: tuple[str, ...],
    wait: bool,
    as_json: bool,
) -> None:
    """Book GPUs (a window, host resources); prints the reservation: placed, or pending with its reason."""
    if duration and until:
        raise UsageError("give --duration or --until, not both")
    now = _local_now()
    start_ms = parse_time(start, now) if start else 0
    end_ms = parse_time(until, now, what="--until") if until else 0
    duration_ms = parse_duration(duration) if duration else 0
    if duration and duration_ms <= 0:
        raise UsageError("a duration must be positive")
    memory_bytes = parse_size(memory) if memory else 0
    labels = parse_selector(selector)
    check_name("--tenant", tenant)
    for option, text, at in (("--start", start, start_ms), ("--until", until, end_ms)):
        if text:
            say_when(option, text, at, now)

    async def go(c: AdminClient) -> admin_pb2.Reservation:
        r = await c.reserve(
            gpus,
            node_id=node_id,
            device_class=device_class,
            binding=binding,
            start_ms=start_ms,
            end_ms=end_ms,
            duration_ms=duration_ms,
            cpus=cpus,
            memory_bytes=memory_bytes,
            hugepages_1g=hugepages_1g,
            tenant=tenant,
            selector=labels,
        )
        if wait:
            if not as_json:
                echo(_change(r))
            r = await _wait(c, r, quiet=as_json)
        return r

    r = call_admin(go)
    emit(as_json, r, "" if wait else _summary(r))  # --wait said each change as it came
    if wait and r.state != "active":
        raise SystemExit(1)


@click.command("reservations")
@click.option("--node", "node_id", default="", help="Only this node's reservations.")
@click.option(
    "--state",
    type=click.Choice(["pending", "active", "ended"]),
    default=None,
    help="pending; active (placed, active, releasing); ended (every terminal state).",
)
@click.option("--tenant", default="", help="Only this tenant's reservations.")
@click.option("--all", "include_released", is_flag=True, help="Include released ones.")
@json_option
def reservations(node_id: str, state: str | None, tenant: str, include_released: bool, as_json: bool) -> None:
    """List reservations in submit order."""
    items = call_admin(
        lambda c: c.list_reservations(
            node_id=node_id, include_released=include_released, state=state or "", tenant=tenant
        )
    )
    emit(as_json, items, lambda: render_reservations(items), empty="no reservations")


def render_reservations(items: list[admin_pb2.Reservation]) -> Lines:
    rows = [
        (
            r.id,
            r.node_id or (f"({r.want_node_id})" if r.want_node_id else "-"),
            r.device_class,
            r.gpus,
            r.state,
            format_age(r.created_age_ms),
            iso_ms(r.start_ms),
            iso_ms(r.end_ms) if r.end_ms else "open",
            r.tenant or "-",
            r.reason or "-",
        )
        for r in items
    ]
    headers = ("ID", "NODE", "CLASS", "GPUS", "STATE", "AGE", "START", "END", "TENANT", "REASON")
    return render_table(headers, rows)


@click.group("reservation")
def reservation() -> None:
    """One reservation."""


@reservation.command("show")
@click.argument("reservation_id", metavar="ID")
@json_option
def reservation_show(reservation_id: str, as_json: bool) -> None:
    """A reservation: its state and reason, window, host resources and devices."""
    r = call_admin(lambda c: c.get_reservation(reservation_id))
    emit(as_json, r, lambda: render_reservation(r))


def render_reservation(r: admin_pb2.Reservation) -> Lines:
    fields = [
        ("id", r.id),
        ("state", r.state + (f" ({r.reason})" if r.reason else "")),
        ("node", r.node_id or "-"),
        ("asked node", r.want_node_id or "-"),
        ("class", f"{r.gpus} x {r.device_class}"),
        ("binding", r.binding),
        ("window", f"{iso_ms(r.start_ms)} .. {iso_ms(r.end_ms) if r.end_ms else 'open'}"),
        ("host", f"{r.cpus} CPUs, {r.memory_bytes} bytes memory, {r.hugepages_1g} x 1 GiB huge pages"),
        ("tenant", r.tenant or "-"),
        ("selector", ",".join(f"{k}={v}" for k, v in sorted(r.selector.items())) or "-"),
        ("devices", ", ".join(d.atom_id for d in r.devices) or "-"),
    ]
    return render_table(("FIELD", "VALUE"), fields)


@click.group("capacity")
def capacity() -> None:
    """Why reservations are where they are."""


@capacity.command("explain")
@click.argument("reservation_id", metavar="ID")
@json_option
def capacity_explain(reservation_id: str, as_json: bool) -> None:
    """Why a reservation is not placed (what the next placement pass would decide)."""
    e = call_admin(lambda c: c.explain_reservation(reservation_id))
    out = [f"reservation {e.reservation_id}: {e.state}: {e.reason}"]
    if e.queue_position:
        out.append(f"position in the queue: {e.queue_position}")
    if e.earliest_start_ms:
        out.append(f"earliest start: {iso_ms(e.earliest_start_ms)} on {e.held_node_id} (held for it)")
    emit(as_json, e, lines(out))


@click.command("usage")
@click.option("--since", default="", help="From this time: 1h (ago), -1h, 20:00 (the last), 2026-12-01.")
@click.option("--until", "until", default="", help="Up to this time (default: now), read as --since is.")
@click.option("--by", type=click.Choice(["reservation", "tenant", "node"]), default="reservation", show_default=True)
@click.option("--csv", "as_csv", is_flag=True, help="Print CSV.")
@json_option
def usage(since: str, until: str, by: str, as_csv: bool, as_json: bool) -> None:
    """Usage per class, in the units it is billed in: GPU-hours, MIG instance-hours by profile, slot-hours.

    From the flushed windows plus each running hold's open window; one row per key and class.
    """
    if as_csv and as_json:
        raise UsageError("give --json or --csv, not both")
    since_ms = _past(since) if since else 0
    until_ms = _past(until, "--until") if until else 0
    resp = call_admin(lambda c: c.usage(since_ms=since_ms, until_ms=until_ms, by=by))
    rows = list(resp.rows)
    if as_csv:
        # The first three columns as they always were; the class and its unit after them.
        header = [by, "atom_seconds", "windows", "class", "profile", "hours", "unit"]
        records = [
            csv_row(
                [
                    r.key,
                    f"{r.atom_seconds:.3f}",
                    r.windows,
                    r.device_class,
                    r.profile,
                    f"{units.hours(r.atom_ms):.6f}",
                    units.unit_of(r.device_class),
                ]
            )  # never a formula in a spreadsheet
            for r in rows
        ]
        echo(lines(_csv_line(record) for record in [header, *records]))
        return
    emit(
        as_json,
        [
            {
                by: r.key,
                "atom_ms": r.atom_ms,
                "atom_seconds": r.atom_seconds,
                "windows": r.windows,
                "class": r.device_class,
                "profile": r.profile,
                "hours": units.hours(r.atom_ms),
                "unit": units.unit_of(r.device_class),
            }
            for r in rows
        ],
        lambda: render_table(
            (by.upper(), "CLASS", "USAGE", "ATOM-SECONDS", "WINDOWS"),
            [
                (
                    r.key,
                    units.class_label(r.device_class, r.profile),
                    f"{units.hours(r.atom_ms):.3f} {units.unit_of(r.device_class)}",
                    f"{r.atom_seconds:.3f}",
                    r.windows,
                )
                for r in rows
            ],
        ),
        empty="no usage",
    )


def _csv_line(values: list[str]) -> str:
    """One CSV record as one line: a cell with a line break in it shows it escaped (`\\x0a`), as echo does."""
    buf = io.StringIO()
    csv.writer(buf, lineterminator="").writerow(values)
    return buf.getvalue()


def _past(text: str, what: str = "--since") -> int:
    """A time for --since/--until: a bare 20:00 is the last one, a bare 1h is an hour ago (`bc.cli.times`)."""
    return times.parse_instant(text, _local_now(), toward=times.Toward.BEHIND, what=what)


COMMANDS: tuple[click.Command, ...] = (reserve, reservations, reservation, capacity, usage)
