"""Approvals: batches waiting for the quorum; `a` approves and `x` rejects with a local approver key.

Under a viewer certificate the screen lists batches and offers neither key (the server
refuses a viewer's decision anyway; the TUI does not pretend otherwise).
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import DataTable, Static

from bc.errors import BcError
from bc.protocol.pb import admin_pb2
from tui import approvals as ap
from tui import columns, fmt
from tui.screens.base import BcScreen
from tui.shown import SafeTable, Shown
from tui.widgets import ConfirmScreen, PromptScreen

BATCH_COLUMNS = ("BATCH", "WHAT", "APPROVALS", "REQUESTED BY", "REASON", "AGE")
CHANGE_COLUMNS = ("CHANGE", "WHAT", "APPROVALS", "REQUESTED BY", "AGE")


class ApprovalsScreen(BcScreen):
    AUTO_FOCUS = "#batches"
    RELOAD_ON = ("batch.", "approver.", "quorum.")
    BINDINGS = [
        Binding("a", "approve", "Approve"),
        Binding("x", "reject", "Reject"),
        Binding("r", "refresh", "Refresh"),
    ]
    DEFAULT_CSS = """
    #batches { height: 1fr; }
    #quorum-changes { height: auto; max-height: 8; }
    #batch-detail { height: auto; max-height: 14; border-top: solid $primary; padding: 0 1; }
    """

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[admin_pb2.BatchInfo] = []

    def body(self) -> ComposeResult:
        yield Static("BATCHES WAITING FOR APPROVAL", classes="title")
        yield SafeTable(id="batches", cursor_type="row")
        yield Shown(id="batch-detail")
        # Approver and threshold changes wait for the quorum too; they are signed with `bc approve sign ID`.
        yield Static("QUORUM CHANGES WAITING (approvers, threshold: sign with `bc approve sign ID`)", classes="title")
        yield SafeTable(id="quorum-changes", cursor_type="row")

    def on_mount(self) -> None:
        super().on_mount()
        t = self.query_one("#batches", SafeTable)
        t.add_columns(*BATCH_COLUMNS)
        self.query_one("#quorum-changes", SafeTable).add_columns(*CHANGE_COLUMNS)
        t.focus()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in ("approve", "reject"):
            return self.bc.role != "viewer"
        return True

    async def reload(self) -> None:
        src = self.bc.feed.source
        if src is None:
            return
        try:
            self.batches = await src.list_batches(state="pending")
            changes = await src.list_quorum_changes(state="pending")
        except BcError as e:
            self.tell(fmt.text(f"batches: {e.message}"), severity="error")
            return
        self._show_changes(changes)
        self.bc.known_batches = {b.id: b for b in self.batches}
        t = self.query_one("#batches", SafeTable)
        keep = self._current_id()
        rows = [
            (
                b.id,
                ap.leaves_summary(b),
                f"{b.approvals} of {b.threshold}",
                b.requested_by,
                b.reason or "-",
                fmt.age(b.created_age_ms),
            )
            for b in self.batches
        ]
        # WHAT and REASON get the room the terminal has, not a fixed clip.
        sized = columns.sized(self._table_width(t), BATCH_COLUMNS, rows, (1, 4))
        columns.refill(t, sized, [b.id for b in self.batches])
        if keep and keep in self.bc.known_batches:
            t.move_cursor(row=t.get_row_index(keep), animate=False)
        self._detail()

    def _show_changes(self, changes: list[admin_pb2.QuorumChangeInfo]) -> None:
        t = self.query_one("#quorum-changes", SafeTable)
        rows = [
            (c.id, c.summary, f"{c.approvals} of {c.threshold}", c.requested_by, fmt.age(c.created_age_ms))
            for c in changes
        ]
        columns.refill(t, columns.sized(self._table_width(t), CHANGE_COLUMNS, rows, (1,)), [c.id for c in changes])

    def _table_width(self, t: SafeTable) -> int:
        return t.size.width or self.app.size.width

    def _current_id(self) -> str | None:
        t = self.query_one("#batches", SafeTable)
        if t.row_count == 0:
            return None
        return str(t.coordinate_to_cell_key(t.cursor_coordinate).row_key.value)

    def _current(self) -> admin_pb2.BatchInfo | None:
        bid = self._current_id()
        return self.bc.known_batches.get(bid) if bid else None

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        self._detail()

    def _detail(self) -> None:
        b = self._current()
        box = self.query_one("#batch-detail", Shown)
        if b is None:
            box.show(fmt.text("nothing is waiting for approval"))
            return
        decided = ", ".join(f"{d.name} {d.decision}" for d in b.decisions) or "none yet"
        box.show(
            fmt.block(
                [
                    f"batch          {b.id}",
                    f"what           {ap.leaves_summary(b)}",
                    f"payload        {b.payload_json or '{}'}",
                    f"requested by   {b.requested_by}: {b.reason or 'no reason given'}",
                    f"approvals      {b.approvals} of {b.threshold} ({decided})",
                    *([f"job            {b.dag_id}"] if b.dag_id else []),
                    f"scope root     {b.scope_root}",
                    *(["(viewer certificate: approve and reject are not offered)"] if self.bc.role == "viewer" else []),
                ]
            )
        )

    def action_refresh(self) -> None:
        self.spawn(self.reload, "reload")

    def action_approve(self) -> None:
        b = self._current()
        if b is not None:
            self.spawn(partial(self._approve, b.id), "decide")

    def action_reject(self) -> None:
        b = self._current()
        if b is not None:
            self.spawn(partial(self._reject, b.id), "decide")

    async def _key_path(self) -> Path | None:
        path = await self.app.push_screen_wait(
            PromptScreen(fmt.text("approver key file (read for this signature only):"), self.bc.approver_key or "")
        )
        if not path:
            return None
        self.bc.approver_key = path  # the path, never the key
        return Path(path)

    async def _approve(self, batch_id: str) -> None:
        src = self.source()
        if src is None:
            return
        try:
            b = await src.get_batch(batch_id)
            now_ms = (await src.server_info()).server_time_ms
            approval = ap.prepare(b, now_ms)
        except BcError as e:
            self.tell(fmt.text(f"cannot approve {batch_id}: {e.message}"), severity="error", timeout=8)
            return
        key_file = await self._key_path()
        if key_file is None:
            return
        yes = await self.app.push_screen_wait(
            ConfirmScreen(fmt.text(f"Approve batch {b.id}? You sign:"), fmt.block(approval.describe()))
        )
        if not yes:
            self.tell(fmt.text(f"did not approve {b.id}"))
            return
        try:
            kid, sig = ap.sign_approval(approval, key_file)
        except BcError as e:
            self.tell(fmt.text(e.message), severity="error", timeout=8)
            return
        after = await self.call(
            f"approve {b.id}", src.decide_batch(b.id, kid, sig, approve=True, expires_at_ms=approval.expires_at_ms)
        )
        if isinstance(after, admin_pb2.BatchInfo):
            self.tell(
                fmt.text(f"signed batch {b.id}: {after.approvals} of {after.threshold} approvals; it is {after.state}")
            )
        await self.reload()

    async def _reject(self, batch_id: str) -> None:
        src = self.source()
        if src is None:
            return
        try:
            b = await src.get_batch(batch_id)
        except BcError as e:
            self.tell(fmt.text(e.message), severity="error")
            return
        key_file = await self._key_path()
        if key_file is None:
            return
        reason = await self.app.push_screen_wait(
            PromptScreen(fmt.text(f"why reject {b.id}? (stored, shown to the requester)"))
        )
        if not reason:
            return
        body = fmt.block(
            [
                f"batch {b.id}: {ap.leaves_summary(b)}",
                f"scope root {b.scope_root}",
                f"reason: {reason}",
                "Its commands never run.",
            ]
        )
        if not await self.app.push_screen_wait(ConfirmScreen(fmt.text(f"Reject batch {b.id}?"), body)):
            return
        try:
            kid, sig = ap.sign_rejection(b, key_file, reason)
        except BcError as e:
            self.tell(fmt.text(e.message), severity="error", timeout=8)
            return
        after = await self.call(f"reject {b.id}", src.decide_batch(b.id, kid, sig, approve=False, reason=reason))
        if isinstance(after, admin_pb2.BatchInfo):
            self.tell(fmt.text(f"rejected batch {b.id}; its commands are cancelled"))
        await self.reload()
