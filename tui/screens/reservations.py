"""Reservations: pending (and why each waits), active (node, devices, window, usage so far), ended; `d` releases.

Devices show as their CDI names (`bc.dev/gpu=…`, what a container asks for). Usage is what
`bc usage --by reservation` reports, in its class's unit (GPU·h, MIG·h with the profile, slot·h):
the windows the placement pass has flushed, so a running
hold's figure trails by up to an hour; n/a when the server has none for it yet.
"""

from __future__ import annotations

from functools import partial

from textual.app import ComposeResult
from textual.binding import Binding

from bc.client.fmt import format_time_ms
from bc.errors import BcError
from bc.protocol import usage_units as units
from bc.protocol.atoms import cdi_qualified
from bc.protocol.pb import admin_pb2
from tui import columns, fmt
from tui.screens.base import BcScreen
from tui.shown import SafeTable, Shown
from tui.widgets import ConfirmScreen

GROUPS = (("pending", "pending"), ("active", "active"), ("ended", "ended"))


def used_text(rows: list[admin_pb2.UsageRow] | None) -> str:
    """A reservation's usage in its class's unit (`2.5 GPU·h`, `0.5 MIG·h 1g.10gb`, `4.0 slot·h`), n/a when none."""
    if not rows:
        return fmt.NA
    return ", ".join(units.amount(r.atom_ms, r.device_class, r.profile, short=True) for r in rows)


def window(r: admin_pb2.Reservation) -> str:
    start = format_time_ms(r.start_ms) if r.start_ms else "asap"
    end = format_time_ms(r.end_ms) if r.end_ms else "open-ended"
    return f"{start} → {end}"


RESERVATION_COLUMNS = ("GROUP", "ID", "STATE", "NODE", "GPUS", "CDI DEVICES / WHY IT WAITS", "WINDOW", "USED", "TENANT")


class ReservationsScreen(BcScreen):
    AUTO_FOCUS = "#reservations"
    RELOAD_ON = ("reservation.",)
    BINDINGS = [Binding("d", "release", "Release"), Binding("r", "refresh", "Refresh")]

    def __init__(self) -> None:
        super().__init__()
        self.by_id: dict[str, admin_pb2.Reservation] = {}

    def body(self) -> ComposeResult:
        yield Shown(id="reservations-summary")
        yield SafeTable(id="reservations", cursor_type="row")

    def on_mount(self) -> None:
        super().on_mount()
        t = self.query_one("#reservations", SafeTable)
        t.add_columns(*RESERVATION_COLUMNS)
        t.focus()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        return self.bc.role != "viewer" if action == "release" else True

    async def reload(self) -> None:
        src = self.bc.feed.source
        if src is None:
            return
        groups: list[tuple[str, list[admin_pb2.Reservation]]] = []
        try:
            for title, state in GROUPS:
                groups.append((title, await src.list_reservations(state=state, include_released=state == "ended")))
            used: dict[str, list[admin_pb2.UsageRow]] = {}
            for u in (await src.usage(by="reservation")).rows:
                used.setdefault(u.key, []).append(u)
        except BcError as e:
            self.tell(fmt.text(f"reservations: {e.message}"), severity="error")
            return
        t = self.query_one("#reservations", SafeTable)
        self.by_id.clear()
        rows: list[tuple[str, ...]] = []
        for title, rs in groups:
            for r in rs[-200:]:
                if r.id in self.by_id:
                    continue
                self.by_id[r.id] = r
                devices = ", ".join(cdi_qualified(d.atom_id or d.gpu_uuid) for d in r.devices)
                what = r.reason if title == "pending" else (devices or r.reason or "-")
                rows.append(
                    (
                        title,
                        r.id,
                        r.state,
                        r.node_id or "-",
                        str(r.gpus),
                        what,
                        window(r),
                        used_text(used.get(r.id)) if title != "pending" else "-",
                        r.tenant or "-",
                    )
                )
        width = t.size.width or self.app.size.width  # devices / why and the window share the room left
        columns.refill(t, columns.sized(width, RESERVATION_COLUMNS, rows, (5, 6)), list(self.by_id))
        counts = ", ".join(f"{len(rs)} {title}" for title, rs in groups)
        self.query_one("#reservations-summary", Shown).show(fmt.text(counts))

    def action_refresh(self) -> None:
        self.spawn(self.reload, "reload")

    def action_release(self) -> None:
        t = self.query_one("#reservations", SafeTable)
        if t.row_count:
            rid = str(t.coordinate_to_cell_key(t.cursor_coordinate).row_key.value)
            self.spawn(partial(self._release, rid), "release")

    async def _release(self, rid: str) -> None:
        r = self.by_id[rid]
        body = fmt.text(
            f"{rid}: {r.gpus} {r.device_class} on {r.node_id or 'no node yet'} ({r.state}); its devices are freed"
        )
        if not await self.app.push_screen_wait(ConfirmScreen(fmt.text(f"Release {rid}?"), body)):
            return
        src = self.source()
        if src is not None:
            out = await self.call(f"release {rid}", src.release(rid))
            if isinstance(out, admin_pb2.Reservation):
                self.tell(fmt.text(f"{rid} is {out.state}"))
        await self.reload()
