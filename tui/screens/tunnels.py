"""Tunnels: the open ones (docs/access.md), who opened which, to what port, since when, bytes each way, why;
`x` closes the selected one (admin: the server refuses anyone else, and the key is hidden from them).

`ListTunnels` is the read `bc tunnels list --open` makes; every string an operator supplied (the reason) is
fmt-made, so it reaches the terminal escaped. A `tunnel.` event reloads the table.
"""

from __future__ import annotations

from functools import partial

from textual.app import ComposeResult
from textual.binding import Binding

from bc.client.fmt import format_time_ms
from bc.errors import BcError
from bc.protocol.pb import tunnel_pb2
from tui import columns, fmt
from tui.screens.base import BcScreen
from tui.shown import SafeTable, Shown
from tui.widgets import ConfirmScreen

TUNNEL_COLUMNS = ("SID", "NODE", "OPERATOR", "PURPOSE", "SINCE", "UP", "DOWN", "WHY")


def _bytes(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def tunnel_rows(tunnels: list[tunnel_pb2.TunnelRecord]) -> list[tuple[str, tuple[str, ...]]]:
    return [
        (
            t.sid,
            (
                t.sid,
                t.node_id,
                t.operator,
                f"{t.purpose}:{t.port}",
                format_time_ms(t.opened_at_ms or t.issued_at_ms),
                _bytes(t.bytes_up),
                _bytes(t.bytes_down),
                t.reason or "-",
            ),
        )
        for t in tunnels
    ]


class TunnelsScreen(BcScreen):
    AUTO_FOCUS = "#tunnels"
    RELOAD_ON = ("tunnel.",)
    BINDINGS = [Binding("x", "close_tunnel", "Close"), Binding("r", "refresh", "Refresh")]

    def __init__(self) -> None:
        super().__init__()
        self.tunnels: dict[str, tunnel_pb2.TunnelRecord] = {}

    def body(self) -> ComposeResult:
        yield Shown(id="tunnels-summary")
        yield SafeTable(id="tunnels", cursor_type="row")

    def on_mount(self) -> None:
        super().on_mount()
        t = self.query_one("#tunnels", SafeTable)
        t.add_columns(*TUNNEL_COLUMNS)
        t.focus()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        return self.bc.role == "admin" if action == "close_tunnel" else True

    async def reload(self) -> None:
        src = self.bc.feed.source
        if src is None:
            return
        try:
            found = await src.list_tunnels(open_only=True)
        except BcError as e:
            self.tell(fmt.text(f"tunnels: {e.message}"), severity="error")
            return
        self.tunnels = {t.sid: t for t in found}
        rows = tunnel_rows(found)
        t = self.query_one("#tunnels", SafeTable)
        width = t.size.width or self.app.size.width  # WHY gets the room left
        columns.refill(t, columns.sized(width, TUNNEL_COLUMNS, [r for _, r in rows], (7,)), [k for k, _ in rows])
        summary = f"{len(found)} open tunnel(s)" if found else "no open tunnels"
        self.query_one("#tunnels-summary", Shown).show(fmt.text(summary))

    def _current_sid(self) -> str | None:
        t = self.query_one("#tunnels", SafeTable)
        if t.row_count == 0:
            return None
        return str(t.coordinate_to_cell_key(t.cursor_coordinate).row_key.value)

    def action_refresh(self) -> None:
        self.spawn(self.reload, "reload")

    def action_close_tunnel(self) -> None:
        sid = self._current_sid()
        if sid:
            self.spawn(partial(self._close, sid), "close")

    async def _close(self, sid: str) -> None:
        t = self.tunnels[sid]
        confirm = ConfirmScreen(
            fmt.text(f"Close {sid}?"), fmt.text(f"{t.operator}'s {t.purpose} tunnel to {t.node_id}")
        )
        if not await self.app.push_screen_wait(confirm):
            return
        src = self.source()
        if src is not None:
            out = await self.call(f"close {sid}", src.close_tunnel(sid, reason="closed from bc tui"))
            if isinstance(out, tunnel_pb2.TunnelRecord):
                self.tell(fmt.text(f"{sid} is {out.state}"))
        await self.reload()
