"""The operator's commands: tokens, nodes, specs, reservations, events.

Each one finds the operator config (no connection flags: `bc serve` leaves the
config where `bc.runtime.config` looks), makes one or two Admin calls and renders the
reply: a table for people, or with `--json` a JSON document on stdout and
nothing else there (progress goes to stderr). The JSON keys are the proto
field names; scripts (and the black-box checks) rely on them.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from bc.cli.connect import run_client, slow
from bc.cli.emit import emit
from bc.cli.job_progress import check_done, follow
from bc.cli.machine_view import render_machine
from bc.cli.msg_json import message_json_text
from bc.cli.output import JsonArray, Lines, echo, json_lines, lines, paragraphs
from bc.cli.render import (
    INT64_MAX,
    cell,
    format_age,
    format_bytes,
    format_duration,
    format_mib,
    format_span,
    format_time_ms,
    message_to_json,
    parse_duration,
    render_fields,
    render_table,
)
from bc.client.admin import AdminClient
from bc.client.reconnect import follow_events
from bc.errors import UsageError
from bc.protocol import labels as node_labels
from bc.protocol import usage_units as units
from bc.protocol.limits import LIMITS
from bc.protocol.pb import admin_pb2, common_pb2
from bc.protocol.sections import SECTIONS
from bc.runtime.config import default_data_dir
from bc.runtime.local_files import read_local_file
from bc.seams.clock import SystemClock

_T = TypeVar("_T")

json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")


def call_admin(fn: Callable[[AdminClient], Awaitable[_T]]) -> _T:
    """Run `fn` against `bc serve` with a fresh client; a slow answer says so on stderr."""
    return run_client(lambda c: slow(c, fn(c)))


# -- token ---------------------------------------------------------------------


@click.group("token")
def token() -> None:
    """Join tokens: one-use secrets that let a host join as a node."""


@token.command("create")
@click.option("--node-id", required=True, help="The node the token admits.")
@click.option("--role", type=click.Choice(["node", "site", "ramdisk"]), default="node", show_default=True)
@click.option("--ttl", default="1h", show_default=True, help="How long the token is valid: 90s, 10m, 1h, 2d.")
@json_option
def token_create(node_id: str, role: str, ttl: str, as_json: bool) -> None:
    """Create a join token; it is printed alone on the last line."""
    ttl_s = parse_duration(ttl, what="--ttl")
    resp = call_admin(lambda c: c.create_token(node_id, role=role, ttl_s=ttl_s))
    emit(
        as_json,
        resp,
        lines(
            f"join token for {resp.node_id} (role {role}), expires in {format_duration(ttl_s)}, one use:", resp.token
        ),
    )


# -- nodes ---------------------------------------------------------------------


@click.group("nodes", invoke_without_command=True)
@click.option("--all", "show_all", is_flag=True, help="Deleted nodes too (their history is kept).")
@json_option
@click.pass_context
def nodes(ctx: click.Context, show_all: bool, as_json: bool) -> None:
    """List the nodes (or `bc nodes show NODE` for one)."""
    if ctx.invoked_subcommand is not None:
        return
    if as_json:
        call_admin(lambda c: _print_nodes_json(c, show_all))
        return
    infos = call_admin(lambda c: c.list_nodes(include_deleted=show_all))
    emit(
        as_json,
        infos,
        lambda: render_nodes(infos),
        empty="no nodes yet: `bc token create --node-id N`, then `bc join` on the host",
    )


async def _print_nodes_json(client: AdminClient, show_all: bool) -> None:
    """`bc nodes --json`: the nodes printed page by page as the server streams them (10,000 nodes never sit
    in one message or one string), the same bytes as `emit` printed for the whole list."""
    out = JsonArray()
    async for page in client.fleet_pages(include_deleted=show_all):
        out.add_texts([message_json_text(n, "  ") for n in page.nodes])
    out.close()


def render_nodes(infos: list[admin_pb2.NodeInfo]) -> Lines:
    rows = [
        (
            n.node_id,
            n.role,
            n.state,
            n.generation,
            n.applied_generation,
            n.observed_generation,
            format_age(n.last_seen_age_ms),
            _flags(n),
        )
        for n in infos
    ]
    return render_table(("NODE", "ROLE", "STATE", "GEN", "APPLIED", "OBSERVED", "LAST SEEN", "FLAGS"), rows)


def _flags(n: admin_pb2.NodeInfo) -> str:
    """Its NoSchedule reasons (revoked, cordoned, a job's hold, not connected, unhealthy GPUs), or "-"."""
    return ",".join(n.no_schedule) or "-"


@nodes.command("revoke")
@click.argument("node_id", metavar="NODE")
@click.option("--reason", default="", help="Why (stored with the revocation and sent to the node).")
@json_option
def nodes_revoke(node_id: str, reason: str, as_json: bool) -> None:
    """Revoke every certificate of NODE: its session ends within seconds and it cannot reconnect.

    Nothing the node holds is released; to bring the host back, join it again
    with a new token (`bc join --reset --yes` on the host).
    """
    info = call_admin(lambda c: c.revoke_node(node_id, reason=reason))
    emit(as_json, info, f"revoked the certificates of {node_id}; its session ends within seconds")


@nodes.command("cordon")
@click.argument("node_id", metavar="NODE")
@json_option
def nodes_cordon(node_id: str, as_json: bool) -> None:
    """Stop placing new reservations on NODE (what runs there keeps running): a one-node job."""
    _cordon(node_id, True, as_json)


@nodes.command("uncordon")
@click.argument("node_id", metavar="NODE")
@json_option
def nodes_uncordon(node_id: str, as_json: bool) -> None:
    """Place reservations on NODE again: a one-node job."""
    _cordon(node_id, False, as_json)


def _cordon(node_id: str, cordon: bool, as_json: bool) -> None:
    """A one-node `cordon`/`uncordon` job (as `bc jobs run cordon NODE`), followed to its end; then the node."""
    template = "cordon" if cordon else "uncordon"

    async def go(c: AdminClient) -> admin_pb2.NodeInfo:
        job = await c.submit_job(admin_pb2.SubmitJobRequest(template=template, nodes=[node_id]))
        if not job.terminal:
            echo(f"job {job.id}: the {template} of {node_id} waits its turn behind another job on the node", err=True)
        check_done(await follow(c, job, lambda line: echo(line, err=True)))
        return await c.get_node(node_id)

    info = call_admin(go)
    emit(as_json, info, f"{'cordoned' if cordon else 'uncordoned'} {node_id}")


@nodes.command("label")
@click.argument("node_id", metavar="NODE")
@click.argument("pairs", nargs=-1, metavar="KEY=VALUE...")
@click.option("--remove", "remove", multiple=True, metavar="KEY", help="Remove this label (repeatable).")
@json_option
def nodes_label(node_id: str, pairs: tuple[str, ...], remove: tuple[str, ...], as_json: bool) -> None:
    """Set labels on NODE (`pool=a100`) and remove others (`--remove pool`), in one write.

    Reservations select nodes by label; keys under bc.dev/cap. and bc.dev/driver. are the system's.
    """
    set_ = node_labels.parse_pairs(pairs)
    info = call_admin(lambda c: c.label_node(node_id, set_, list(remove)))
    shown = ", ".join(f"{k}={v}" for k, v in sorted(info.labels.items())) or "none"
    emit(as_json, info, f"{node_id} labels: {shown}")


@nodes.command("delete")
@click.argument("node_id", metavar="NODE")
@click.option("--yes", is_flag=True, help="Really delete: its certificates are revoked; its history is kept.")
@json_option
def nodes_delete(node_id: str, yes: bool, as_json: bool) -> None:
    """Delete a cordoned NODE with no live reservation: its certificates are revoked, its open commands
    settle, and it stays as a deleted node with its history (`bc nodes --all`); a new token revives the id."""
    if not yes:
        raise UsageError(f"deleting {node_id} revokes its certificates and takes it out of the fleet; add --yes")
    resp = call_admin(lambda c: c.delete_node(node_id))
    emit(as_json, resp, f"deleted {node_id} ({resp.revoked_certificates} certificate(s) revoked)")


@nodes.command("show")
@click.argument("node_id", metavar="NODE")
@json_option
@click.pass_context
def nodes_show(ctx: click.Context, node_id: str, as_json: bool) -> None:
    """One node: state, generations, sections, conditions, capacity, usage by class and inventory."""
    parent_json = ctx.parent is not None and bool(ctx.parent.params.get("as_json"))
    if as_json or parent_json:  # the NodeInfo alone; usage by class is `bc usage --by node --json`
        emit(True, call_admin(lambda c: c.get_node(node_id)), "")
        return

    async def both(c: AdminClient) -> tuple[admin_pb2.NodeInfo, list[admin_pb2.UsageRow]]:
        info = await c.get_node(node_id)
        return info, [r for r in (await c.usage(by="node")).rows if r.key == node_id]

    info, used = call_admin(both)
    emit(False, info, lambda: render_node(info, used))


def render_node(n: admin_pb2.NodeInfo, usage: list[admin_pb2.UsageRow] | None = None) -> Lines:
    state = f"{n.state} for {format_span(n.state_age_ms)}" if n.state_age_ms >= 0 else n.state
    fields: list[tuple[str, object]] = [
        ("node", n.node_id),
        ("role", n.role),
        ("state", state),
        ("last seen", format_age(n.last_seen_age_ms)),
        ("generation", f"{n.generation} (applied {n.applied_generation}, observed {n.observed_generation})"),
        ("spec hash", n.spec_hash),
        ("applied hash", n.applied_spec_hash),
        ("session epoch", f"{n.session_epoch} via {n.gateway_id}" if n.gateway_id else n.session_epoch),
        ("boot id", n.boot_id),
        ("journal id", n.journal_id),
        ("cordoned", "yes" if n.cordoned else "no"),
        ("job hold", f"{n.job_hold} (out of placement for that job's run)" if n.job_hold else "-"),
        ("no schedule", ", ".join(n.no_schedule) or "-"),
        ("certificate", _cert_line(n)),
        ("labels", ", ".join(f"{k}={v}" for k, v in sorted(n.labels.items()))),
        ("capabilities", ", ".join(n.capabilities)),
    ]
    parts: list[Lines] = [render_fields(fields)]
    rows: list[tuple[object, ...]]
    if n.sections:
        rows = [
            (s.section, _section_state(s.state), s.generation, s.reason, cell(s.message, width=60)) for s in n.sections
        ]
        parts.append(lines("SECTIONS", render_table(("SECTION", "STATE", "GENERATION", "REASON", "MESSAGE"), rows)))
    if n.conditions:
        rows = [(c.type, c.status, c.reason, format_age(c.age_ms), cell(c.message, width=60)) for c in n.conditions]
        parts.append(lines("CONDITIONS", render_table(("TYPE", "STATUS", "REASON", "SINCE", "MESSAGE"), rows)))
    if n.capacity:
        rows = [(c.device_class, c.offered, c.booked_now, c.free_now, c.booked_later) for c in n.capacity]
        parts.append(
            lines("CAPACITY", render_table(("CLASS", "OFFERED", "BOOKED NOW", "FREE NOW", "BOOKED LATER"), rows))
        )
    if usage:  # each class in its own unit: a MIG instance or a shared slot is not a GPU-hour
        rows = [
            (units.class_label(u.device_class, u.profile), units.amount(u.atom_ms, u.device_class, u.profile))
            for u in usage
        ]
        parts.append(lines("USAGE (all recorded)", render_table(("CLASS", "USED"), rows)))
    if n.HasField("host_capacity") and n.host_capacity.cpus:
        h = n.host_capacity
        gib = 1 << 30
        parts.append(
            render_fields(
                [
                    ("cpus booked", f"{h.cpus_booked} of {h.cpus}"),
                    ("memory booked", f"{h.memory_booked / gib:.0f} of {h.memory_bytes / gib:.0f} GiB"),
                    ("1 GiB huge pages booked", f"{h.hugepages_1g_booked} of {h.hugepages_1g}"),
                ]
            )
        )
    if n.HasField("inventory"):
        parts.append(render_inventory(n.inventory))
    return paragraphs(*parts)


def _cert_line(n: admin_pb2.NodeInfo) -> str:
    if n.revoked:
        return f"revoked ({n.revoke_reason})"
    if not n.cert_not_after_ms:
        return "-"
    return f"valid until {format_time_ms(n.cert_not_after_ms)}"


def _section_state(state: int) -> str:
    if state == common_pb2.SECTION_STATE_UNSPECIFIED:
        return "-"
    return common_pb2.SectionState.Name(state).lower()


def render_inventory(inv: common_pb2.Inventory) -> Lines:
    if not inv.gpus and not inv.hostname and not inv.source:
        return lines("INVENTORY  not reported yet")
    facts = [
        f"host {inv.hostname}" if inv.hostname else "",
        f"source {inv.source}" if inv.source else "",
        f"driver {inv.driver_version}" if inv.driver_version else "",
        f"{inv.cpus} cpus" if inv.cpus else "",
        f"{format_bytes(inv.memory_bytes)} memory" if inv.memory_bytes else "",
        f"{len(inv.gpus)} GPUs",
    ]
    head = "INVENTORY  " + ", ".join(f for f in facts if f)
    machine = render_machine(inv)  # a ramdisk's disks, NICs and PCI GPUs
    if not inv.gpus:
        return paragraphs(lines(head), *machine)
    rows = [
        (g.index, g.uuid, g.name, format_mib(g.memory_mib), "yes" if g.healthy else "no", _mig(g)) for g in inv.gpus
    ]
    return paragraphs(lines(head, render_table(("GPU", "UUID", "NAME", "MEMORY", "HEALTHY", "MIG"), rows)), *machine)


def _mig(g: common_pb2.Gpu) -> str:
    if not g.mig_enabled:
        return "off"
    if not g.mig_instances:
        return "on, no instances"
    return ", ".join(f"{m.profile or '?'} ({m.gi}/{m.ci})" for m in g.mig_instances)


# -- specs ---------------------------------------------------------------------


@click.group("spec")
def spec() -> None:
    """A node's desired state, section by section."""


@spec.command("show")
@click.argument("node_id", metavar="NODE")
@json_option
def spec_show(node_id: str, as_json: bool) -> None:
    """The node's spec, its generation and hash."""
    _print_spec(call_admin(lambda c: c.get_spec(node_id)), as_json=as_json, with_body=True)


@spec.command("set")
@click.argument("node_id", metavar="NODE")
@click.argument("section", type=click.Choice(SECTIONS))
@click.argument("value", metavar="JSON|@FILE")
@json_option
def spec_set(node_id: str, section: str, value: str, as_json: bool) -> None:
    """Replace one section (protobuf JSON; `{}` clears it); prints the new generation."""
    text = read_section_json(section, value)
    info = call_admin(lambda c: c.set_spec_section(node_id, section, text))
    if info.pending_batch_id:  # a root-equivalent change waits for the quorum (docs/quorum.md)
        doc = {"node_id": info.node_id, "generation": info.generation, "pending_batch_id": info.pending_batch_id}
        emit(
            as_json,
            doc,
            f"the {section} change is root-equivalent: batch {info.pending_batch_id} waits for the approvers"
            f" (bc approve show {info.pending_batch_id}); node {info.node_id} stays at generation {info.generation}",
        )
        return
    _print_spec(info, as_json=as_json, with_body=False)


def read_json_object(what: str, value: str) -> str:
    """JSON object text from the argument, `@path` or `@-` (stdin), checked before any call; `what` names it."""
    if value.startswith("@"):
        path = value[1:]
        try:
            # A file is bounded and must be regular (a FIFO or /dev/zero is exit 2 at once); stdin too is bounded.
            raw = sys.stdin.buffer.read(LIMITS.max_local_file + 1) if path == "-" else read_local_file(path, what)
        except OSError as e:
            raise UsageError(f"cannot read {what} from {path}: {e.strerror or e}") from None
        if len(raw) > LIMITS.max_local_file:
            raise UsageError(f"{what} on stdin is over {LIMITS.max_local_file:,} bytes (max_local_file)")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise UsageError(f"{what} in {path} is not UTF-8 (byte {e.start} is {raw[e.start]:#04x})") from None
    else:
        text = value
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise UsageError(f"{what} is not valid JSON: {e}") from None
    except RecursionError:
        raise UsageError(f"{what} nests too deeply to be read") from None
    if not isinstance(doc, dict):
        raise UsageError(f"{what} must be a JSON object, not {type(doc).__name__}")
    return text.strip()


def read_section_json(section: str, value: str) -> str:
    return read_json_object(f"the {section} section", value)


def _print_spec(info: admin_pb2.SpecInfo, *, as_json: bool, with_body: bool) -> None:
    try:
        body = json.loads(info.spec_json) if info.spec_json else {}
    except json.JSONDecodeError:
        body = info.spec_json  # show what the server sent rather than fail on it
    head = f"node {info.node_id} generation {info.generation} hash {info.spec_hash or '-'}"
    emit(
        as_json,
        {"node_id": info.node_id, "generation": info.generation, "spec_hash": info.spec_hash, "spec": body},
        lines(head, json_lines(body, sort_keys=True)) if with_body else head,
    )


# -- reservations ----------------------------------------------------------------


@click.command("release")
@click.argument("reservation_id", metavar="RESERVATION")
@json_option
def release(reservation_id: str, as_json: bool) -> None:
    """Give a reservation's devices back."""
    r = call_admin(lambda c: c.release(reservation_id))
    emit(as_json, r, f"reservation {r.id} on {r.node_id or '-'}: {r.state}")


# -- events ----------------------------------------------------------------------

_EVENT_HEADERS = ("SEQ", "TIME", "TYPE", "SUBJECT", "DATA")


@click.command("events")
@click.option(
    "--after", "after_seq", type=click.IntRange(min=0, max=INT64_MAX), default=0, help="Events after this seq."
)
@click.option("--type", "type_prefix", default="", help="Only event types starting with this.")
@click.option("--limit", type=click.IntRange(min=0, max=10_000), default=0, help="At most this many (0: server's).")
@click.option("--follow", "-f", is_flag=True, help="Keep printing new events until Ctrl-C.")
@json_option
def events(after_seq: int, type_prefix: str, limit: int, follow: bool, as_json: bool) -> None:
    """The control plane's event log."""
    if follow:
        _follow(after_seq, type_prefix, as_json=as_json)
        return
    items = call_admin(lambda c: c.list_events(after_seq=after_seq, limit=limit, type_prefix=type_prefix))
    rows = [_event_row(e) for e in items]
    emit(as_json, lambda: [event_to_json(e) for e in items], render_table(_EVENT_HEADERS, rows) if rows else "")


def _follow(after_seq: int, type_prefix: str, *, as_json: bool) -> None:
    client = AdminClient.discover()

    async def go() -> None:
        async with client:
            # Across a `bc serve` restart it says so on stderr and resumes after the last event printed.
            events = follow_events(client, SystemClock(), _say, after_seq=after_seq, type_prefix=type_prefix)
            async for e in events:
                # One line per event, flushed, so `| grep` and `| jq` see each as it happens.
                emit(as_json, event_to_json(e), "  ".join(_event_row(e)), compact=True)

    try:
        asyncio.run(go())
    except KeyboardInterrupt:
        pass  # following ends with Ctrl-C; that is success


def _say(line: str) -> None:
    echo(line, err=True)


def event_to_json(e: admin_pb2.EventRecord) -> dict[str, Any]:
    """An event with its data as a JSON value rather than a string holding JSON."""
    doc = message_to_json(e)
    try:
        doc["data"] = json.loads(e.data_json) if e.data_json else {}
    except json.JSONDecodeError:
        doc["data"] = e.data_json
    return doc


def _event_row(e: admin_pb2.EventRecord) -> tuple[str, str, str, str, str]:
    return (str(e.seq), format_time_ms(e.at_ms), e.type, cell(e.subject), cell(e.data_json, width=80))


# -- PKI -------------------------------------------------------------------------


@click.group("pki")
def pki() -> None:
    """The CA and the command-signing keys."""


def _render_pki(info: admin_pb2.PkiInfo) -> Lines:
    fields: list[tuple[str, object]] = [
        ("ca", f"{info.ca_fingerprint} (until {format_time_ms(info.ca_not_after_ms)})"),
        ("command signing", "on" if info.command_signing else "off: nodes accept unsigned commands and specs"),
        ("attested bindings", "on" if info.attested_bindings else "off"),
    ]
    for r in info.roots:
        where = "its key on the bc serve host" if info.root_on_host else "its key kept elsewhere: pass --root-key"
        fields.append(("signing root", f"{r.key_id} (until {format_time_ms(r.not_after_ms)}; {where})"))
    if info.HasField("worker"):
        w = info.worker
        fields.append(("worker key", f"{w.key_id} (until {format_time_ms(w.not_after_ms)})"))
    return render_fields(fields)


@pki.command("show")
@json_option
def pki_show(as_json: bool) -> None:
    """The CA fingerprint, whether commands are signed, the signing root and the worker key."""
    info = call_admin(lambda c: c.get_pki())
    emit(as_json, info, lambda: _render_pki(info))


ROOT_KEY_OPTION = click.option(
    "--root-key",
    "root_key",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="The command-signing root key file (`bc pki root export`), when it is not on the bc serve host:"
    " it signs here and is never sent.",
)


@pki.command("rotate")
@ROOT_KEY_OPTION
@json_option
def pki_rotate(root_key: Path | None, as_json: bool) -> None:
    """Issue a new worker key under the same root and re-sign the current specs and pending commands.

    With --root-key the new worker key and its certificate are made here, under the root in FILE, and sent
    to bc serve, which installs them only if they chain to its root.
    """
    if root_key is None:
        info = call_admin(lambda c: c.rotate_signing_key())
    else:
        from bc.pki.root_offline import issue_worker_with, load_root_key
        from bc.pki.secrets_source import SystemSecrets, os_seeded_random

        pki_info = call_admin(lambda c: c.get_pki())
        key = load_root_key(root_key, pki_info.roots[0].cert_pem if pki_info.roots else "")
        server_now = call_admin(lambda c: c.server_info()).server_time_ms / 1000
        key_pem, cert_pem = issue_worker_with(
            key, pki_info.roots[0].cert_pem, server_now, os_seeded_random(), SystemSecrets()
        )
        info = call_admin(lambda c: c.rotate_signing_key(key_pem, cert_pem))
    emit(
        as_json,
        info,
        f"new worker key {info.worker.key_id}; re-signed {info.resigned_specs} spec(s)"
        f" and {info.resigned_commands} pending command(s)",
    )


@pki.group("root")
def pki_root() -> None:
    """Keep the command-signing root key off this host: export it, then remove it (run where bc serve's data
    dir is)."""


_DATA_DIR = click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="bc serve's data dir (default: $BC_DATA_DIR, else the usual place).",
)


@pki_root.command("export")
@click.option("--out", required=True, type=click.Path(dir_okay=False, path_type=Path), help="A new file (0600).")
@_DATA_DIR
def pki_root_export(out: Path, data_dir: Path | None) -> None:
    """Write the root key to a new file, to keep it offline."""
    from bc.pki.root_offline import export_root

    export_root(data_dir or default_data_dir(), out)
    echo(f"root key written to {out} (0600); keep it offline, then run `bc pki root remove --exported {out}`")


@pki_root.command("remove")
@click.option(
    "--exported",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="The export made by `bc pki root export`: checked to hold the same key first.",
)
@_DATA_DIR
def pki_root_remove(exported: Path, data_dir: Path | None) -> None:
    """Delete the root key from the data dir, once the export holds it."""
    from bc.pki.root_offline import remove_root

    d = data_dir or default_data_dir()
    remove_root(d, exported)
    echo(f"root key removed from {d}; bc pki rotate and quorum changes now take --root-key {exported}")


COMMANDS: tuple[click.Command, ...] = (token, nodes, spec, release, events, pki)  # reserve: capacity_cmds
