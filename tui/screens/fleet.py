"""Fleet: one row per node, live from Watch; `/` filters, `s` sorts, enter opens the node, `g` jumps."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import DataTable, Input

from tui import fmt
from tui.fleet_model import COLUMNS
from tui.fleet_table import FleetTable
from tui.screens.base import BcScreen
from tui.shown import Shown
from tui.widgets import PromptScreen, rows_stale

_SORTABLE = ("node", "conn", "gen", "lag", "heard", "sched", "role")


class FleetScreen(BcScreen):
    AUTO_FOCUS = "#fleet"
    BINDINGS = [
        Binding("slash", "filter", "Filter"),
        Binding("s", "sort", "Sort"),
        Binding("g", "jump", "Jump to node"),
        Binding("enter", "open", "Node", show=True),
        Binding("escape", "clear_filter", "Clear filter", show=False),
    ]
    DEFAULT_CSS = """
    #fleet-status { height: 1; width: 1fr; padding: 0 1; color: $text-muted; }
    #fleet-filter { display: none; }
    #fleet-filter.shown { display: block; }
    """

    def body(self) -> ComposeResult:
        yield Shown(id="fleet-status")
        yield Input(
            placeholder="filter: words in node, state, role, labels, reasons (enter to apply)", id="fleet-filter"
        )
        yield FleetTable(self.bc.state, id="fleet")

    @property
    def table(self) -> FleetTable:
        return self.query_one(FleetTable)

    def on_mount(self) -> None:
        super().on_mount()
        self.table.rebuild(self.bc.clock.monotonic())
        self.table.focus()
        self._status()

    async def reload(self) -> None:
        pass  # the feed keeps the table current

    # Updates are applied at most ten times a second: a busy fleet then redraws the table ten times
    # a second, not once per event (each redraw re-renders every visible row), and no row waits long.
    FLUSH_S = 0.1
    _pending: set[str] | None = None
    _status_text = ""

    def nodes_changed(self, node_ids: set[str]) -> None:
        if self._pending is None:
            self._pending = set(node_ids)
            if self.is_current:
                self.set_timer(self.FLUSH_S, self._flush)
        else:
            self._pending |= node_ids

    def on_screen_resume(self) -> None:
        # A timer set while a node's screen covered this one did not fire: changes kept coming into
        # `_pending` and none reached the table (a node that joined then never showed). Back: apply them.
        self._flush()

    def _flush(self) -> None:
        node_ids, self._pending = self._pending or set(), None
        t = self.table
        if not t.row_count and self.bc.state.rows:
            t.rebuild(self.bc.clock.monotonic())
        else:
            t.update_nodes(node_ids, self.bc.clock.monotonic())
        self._status()

    def tick(self, now: float) -> None:
        super().tick(now)
        self.table.tick(now)
        self._status()

    def _status(self) -> None:
        st = self.bc.state
        total = len(st.rows)
        connected = sum(1 for r in st.rows.values() if r.info.state == "connected")
        lagging = sum(1 for r in st.rows.values() if r.info.observed_generation < r.info.generation)
        shown = self.table.row_count
        title = dict(COLUMNS).get(self.table.sort_column, "")
        filt = f"  filter: {self.table.filter_text!r} ({shown} shown)" if self.table.filter_text else ""
        text = (
            f"{total} nodes · {connected} connected · {lagging} lagging · sorted by {title}{filt} · event {st.cursor}"
        )
        if rows_stale(st.link):
            text += " · STALE"
        if text != self._status_text:
            self._status_text = text
            # A one-line status of fixed size: no layout pass (that would repaint the whole table).
            self.query_one("#fleet-status", Shown).show(fmt.text(text), layout=False)

    def action_filter(self) -> None:
        box = self.query_one("#fleet-filter", Input)
        box.add_class("shown")
        box.value = self.table.filter_text
        box.focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id != "fleet-filter":
            return
        self.table.filter_text = event.value.strip()
        event.input.remove_class("shown")
        self.table.rebuild(self.bc.clock.monotonic())
        self.table.focus()
        self._status()

    def action_clear_filter(self) -> None:
        box = self.query_one("#fleet-filter", Input)
        box.remove_class("shown")
        if self.table.filter_text:
            self.table.filter_text = ""
            self.table.rebuild(self.bc.clock.monotonic())
        self.table.focus()
        self._status()

    def action_sort(self) -> None:
        t = self.table
        t.sort_column = _SORTABLE[(_SORTABLE.index(t.sort_column) + 1) % len(_SORTABLE)]
        t.rebuild(self.bc.clock.monotonic())
        self._status()

    def action_jump(self) -> None:
        def go(node: str | None) -> None:
            if node and not self.table.jump_to(node.strip()):
                self.tell(fmt.text(f"no node {node.strip()!r} in the table (is a filter on?)"), severity="warning")

        self.app.push_screen(PromptScreen(fmt.text("jump to node:")), go)

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        self.action_open()

    def action_open(self) -> None:
        node = self.table.current_node()
        if node:
            self.bc.open_node(node)
