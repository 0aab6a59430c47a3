"""Machines: the bare-metal machines behind site nodes and where their provisioning stands (docs/metal.md).

One row per machine: its site, its state as `bc metal list` shows it (`enrolled`,
`provisioning:<step>`, `provisioned`, `failed:<step>`), its installed OS's node, its last job, when it last
moved, and a failure's words. `ListMachines` is the read `bc metal list` makes; every string (a machine's
name, a BMC URL, a reason an agent or a BMC wrote) is fmt-made, so it reaches the terminal escaped. A
`metal.` or `job.` event reloads the table (each provisioning step publishes `metal.step`).
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding

from bc.client.fmt import format_time_ms
from bc.errors import BcError
from bc.protocol.pb import metal_pb2
from tui import columns, fmt
from tui.screens.base import BcScreen
from tui.shown import SafeTable, Shown

MACHINE_COLUMNS = ("MACHINE", "SITE", "STATE", "NODE", "JOB", "UPDATED", "REASON")  # the BMC: bc metal show


def shown_state(m: metal_pb2.MachineInfo) -> str:
    return f"{m.state}:{m.step}" if m.step and m.state in ("provisioning", "failed") else m.state


def machine_rows(machines: list[metal_pb2.MachineInfo]) -> list[tuple[str, tuple[str, ...]]]:
    return [
        (
            m.name,
            (
                m.name,
                m.site_node,
                shown_state(m),
                m.node_id or "-",
                m.dag_id or "-",
                format_time_ms(m.updated_at_ms),
                m.reason or "-",
            ),
        )
        for m in machines
    ]


def summary(machines: list[metal_pb2.MachineInfo]) -> str:
    if not machines:
        return "no machines (bc metal enroll)"
    counts: dict[str, int] = {}
    for m in machines:
        counts[m.state] = counts.get(m.state, 0) + 1
    return f"{len(machines)} machine(s): " + ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))


class MachinesScreen(BcScreen):
    AUTO_FOCUS = "#machines"
    RELOAD_ON = ("metal.", "job.")
    BINDINGS = [Binding("r", "refresh", "Refresh")]

    def __init__(self) -> None:
        super().__init__()
        self.machines: dict[str, metal_pb2.MachineInfo] = {}

    def body(self) -> ComposeResult:
        yield Shown(id="machines-summary")
        yield SafeTable(id="machines", cursor_type="row")

    def on_mount(self) -> None:
        super().on_mount()
        t = self.query_one("#machines", SafeTable)
        t.add_columns(*MACHINE_COLUMNS)
        t.focus()

    async def reload(self) -> None:
        src = self.bc.feed.source
        if src is None:
            return
        try:
            found = list((await src.list_machines()).machines)
        except BcError as e:
            self.tell(fmt.text(f"machines: {e.message}"), severity="error")
            return
        self.machines = {m.name: m for m in found}
        rows = machine_rows(found)
        t = self.query_one("#machines", SafeTable)
        width = t.size.width or self.app.size.width  # REASON gets the room left
        columns.refill(t, columns.sized(width, MACHINE_COLUMNS, [r for _, r in rows], (6,)), [k for k, _ in rows])
        self.query_one("#machines-summary", Shown).show(fmt.text(summary(found)))

    def action_refresh(self) -> None:
        self.spawn(self.reload, "reload")
