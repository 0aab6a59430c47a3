"""Commands: by state and lane; enter opens one (body, signature status, updates, result); `k` cancels."""

from __future__ import annotations

from functools import partial

from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import DataTable

from bc.errors import BcError
from bc.protocol.pb import admin_pb2
from tui import columns, fmt
from tui.screens.base import BcScreen
from tui.shown import SafeTable, Shown
from tui.widgets import ConfirmScreen

ORDER = ("running", "acked", "dispatched", "pending", "failed", "rejected", "expired", "cancelled", "succeeded")


def signing(c: admin_pb2.CommandInfo, pki: admin_pb2.PkiInfo | None = None) -> str:
    """The command's own signature facts: the worker key that signed its stored body, and for an attested kind
    whether its result was verified as the node's (with signing on, nothing else settles such a command)."""
    if c.signer_key_id:
        body = f"signature: body signed by worker key {c.signer_key_id[:23]}"
    elif pki is not None and pki.command_signing:
        body = "signature: none on this body (queued before command signing was on)"
    else:
        body = "signature: none (command signing is off at the server)"
    if c.attested and c.signer_key_id:
        settled = c.state in ("succeeded", "failed", "rejected")
        return body + (" · result verified as the node's own" if settled else " · its result must be node-signed")
    return body


def describe(
    c: admin_pb2.CommandInfo, pki: admin_pb2.PkiInfo | None = None, updates: list[admin_pb2.EventRecord] | None = None
) -> fmt.Safe:
    seen = [f"  {e.seq:>7} {e.type:<24} {e.data_json}" for e in (updates or [])]
    return fmt.block(
        [
            f"command {c.id}  {c.kind} on {c.node_id}  lane {c.lane}  attempt {c.attempt}",
            f"state {c.state}" + (f" ({c.reason}: {c.message})" if c.reason or c.message else ""),
            f"created {fmt.age(c.created_age_ms)} ago, updated {fmt.age(c.updated_age_ms)} ago"
            f" · requested by {c.requested_by or 'the control plane'}"
            + (f" · batch {c.batch_id} (quorum-approved scope)" if c.batch_id else "")
            + (" · cancel requested" if c.cancel_requested else ""),
            f"idempotency key {c.idempotency_key} · min generation {c.min_generation} · boot {c.boot_id or 'n/a'}",
            signing(c, pki),
            f"result: {c.result_json or ('(left out of the list)' if c.result_omitted else 'none yet')}",
            "updates seen by this TUI:",
            *(seen or ["  none since the TUI started"]),
        ]
    )


COMMAND_COLUMNS = ("STATE", "LANE", "COMMAND", "NODE", "KIND", "UPDATED", "REASON")


class CommandsScreen(BcScreen):
    AUTO_FOCUS = "#commands"
    RELOAD_ON = ("command.",)
    BINDINGS = [
        Binding("enter", "open", "Open"),
        Binding("k", "cancel_command", "Cancel"),
        Binding("r", "refresh", "Refresh"),
    ]
    DEFAULT_CSS = """
    #commands { height: 1fr; }
    #command-detail { height: auto; max-height: 16; border-top: solid $primary; padding: 0 1; }
    """

    def __init__(self) -> None:
        super().__init__()
        self.commands: dict[str, admin_pb2.CommandInfo] = {}

    def body(self) -> ComposeResult:
        yield Shown(id="commands-summary")
        yield SafeTable(id="commands", cursor_type="row")
        yield Shown(id="command-detail")

    def on_mount(self) -> None:
        super().on_mount()
        self.query_one("#commands", SafeTable).add_columns(*COMMAND_COLUMNS)
        self.query_one("#commands", SafeTable).focus()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        return self.bc.role != "viewer" if action == "cancel_command" else True

    async def reload(self) -> None:
        src = self.bc.feed.source
        if src is None:
            return
        try:
            cmds = await src.list_commands(limit=500)
        except BcError as e:
            self.tell(fmt.text(f"commands: {e.message}"), severity="error")
            return
        cmds.sort(key=lambda c: (ORDER.index(c.state) if c.state in ORDER else 99, c.lane, -c.seq))
        self.commands = {c.id: c for c in cmds}
        t = self.query_one("#commands", SafeTable)
        keep = self._current_id()
        rows = [(c.state, c.lane, c.id, c.node_id, c.kind, fmt.age(c.updated_age_ms), c.reason) for c in cmds]
        width = t.size.width or self.app.size.width  # REASON gets the room the terminal has
        columns.refill(t, columns.sized(width, COMMAND_COLUMNS, rows, (6,)), [c.id for c in cmds])
        if keep in self.commands:
            t.move_cursor(row=t.get_row_index(keep), animate=False)
        counts: dict[str, int] = {}
        for c in cmds:
            counts[f"{c.state}/{c.lane}"] = counts.get(f"{c.state}/{c.lane}", 0) + 1
        summary = "  ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "no commands"
        self.query_one("#commands-summary", Shown).show(fmt.text(f"newest {len(cmds)} by state/lane: {summary}"))

    def _current_id(self) -> str | None:
        t = self.query_one("#commands", SafeTable)
        if t.row_count == 0:
            return None
        return str(t.coordinate_to_cell_key(t.cursor_coordinate).row_key.value)

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        self.action_open()

    def action_open(self) -> None:
        cid = self._current_id()
        if cid:
            self.spawn(partial(self._open, cid), "open")

    async def _open(self, cid: str) -> None:
        src = self.source()
        if src is None:
            return
        try:
            c = await src.get_command(cid)
        except BcError as e:
            self.tell(fmt.text(e.message), severity="error")
            return
        try:
            pki: admin_pb2.PkiInfo | None = await src.get_pki()
        except BcError:
            pki = None
        updates = [e for e in self.bc.state.events if e.subject == cid]
        self.query_one("#command-detail", Shown).show(describe(c, pki, updates))

    def action_refresh(self) -> None:
        self.spawn(self.reload, "reload")

    def action_cancel_command(self) -> None:
        cid = self._current_id()
        if cid:
            self.spawn(partial(self._cancel, cid), "cancel")

    async def _cancel(self, cid: str) -> None:
        c = self.commands[cid]
        confirm = ConfirmScreen(fmt.text(f"Cancel {cid}?"), fmt.text(f"{c.kind} on {c.node_id}, {c.state}"))
        if not await self.app.push_screen_wait(confirm):
            return
        src = self.source()
        if src is not None:
            out = await self.call(f"cancel {cid}", src.cancel_command(cid, reason="cancelled from bc tui"))
            if isinstance(out, admin_pb2.CommandInfo):
                self.tell(fmt.text(f"{cid} is {out.state}" + (" (cancel requested)" if out.cancel_requested else "")))
        await self.reload()
