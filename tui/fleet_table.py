"""The fleet table: a DataTable keyed by node id, updated a cell at a time.

Rows keep their place while they update (an update never re-sorts; `s` sorts on request),
and the cursor stays on its node because rows are addressed by key, never by index. The
table remembers the text of each cell on screen and writes only the cells that changed,
which keeps one update at 1,000 nodes well under a frame (bench/tui.py measures it).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from textual.widgets.data_table import ColumnKey

from tui import fmt
from tui.columns import fit, natural
from tui.fleet_model import CLIP, COLUMNS, FLEX, STYLES, Cell, cells, matches, sort_value
from tui.shown import SafeTable
from tui.state import FleetState


class FleetTable(SafeTable):
    def __init__(self, state: FleetState, *, id: str | None = None) -> None:
        super().__init__(id=id, cursor_type="row", zebra_stripes=False)
        self.state = state
        self.filter_text = ""
        self.sort_column = "node"
        self._shown: dict[str, dict[str, Cell]] = {}
        self._hidden: str | None = None
        self.now = 0.0
        self.widths: dict[str, int] = dict(CLIP)  # the free-text columns', sized to the terminal at each rebuild
        self._fitted_to = 0
        self._wants: dict[str, int] = {}  # the free-text columns' whole widths at the last fit

    def on_mount(self) -> None:
        for key, title in COLUMNS:
            self.add_column(title, key=key)

    def _cells(self, node_id: str, widths: Mapping[str, int] | None = None) -> dict[str, Cell]:
        row = self.state.rows[node_id]
        w = self.widths if widths is None else widths
        return cells(row, self.state.inflight, self.now, self.state.server_now_ms(self.now), w)

    def _outgrew(self, node_id: str) -> bool:
        """A free-text cell of this row is now longer than its column was fitted to (a new label)."""
        whole = self._cells(node_id, {})
        return any(len(whole[k][0]) > self._wants.get(k, 0) and self.widths[k] < len(whole[k][0]) for k in FLEX)

    def _width(self) -> int:
        return self.size.width or self.app.size.width

    def _fit(self) -> None:
        """Size the free-text columns to the terminal: whole when the table fits, else sharing what is left."""
        whole = [self._cells(n, {}) for n in self.state.rows]
        need = {k: natural(title, (c[k][0] for c in whole)) for k, title in COLUMNS}
        # Ages and counts grow by a character now and then: room for that, so the table stays on screen.
        fixed = {k: w + (1 if k in ("conn", "heard", "lag") else 0) for k, w in need.items() if k not in FLEX}
        self._wants = {k: need[k] for k in FLEX}
        self.widths = fit(self._width(), fixed, self._wants)
        self._fitted_to = self._width()
        for k in FLEX:  # a column's width only grows as rows are added: start the free ones from their titles
            column = self.columns.get(ColumnKey(k))
            if column is not None:
                column.content_width = len(dict(COLUMNS)[k])

    def on_resize(self) -> None:
        if self._width() != self._fitted_to and self.state.rows:
            self.rebuild(self.now)

    def rebuild(self, now: float) -> None:
        """Every row again, in the chosen order, through the filter (after `/` or `s`, never on an update)."""
        self.now = now
        keep = self.current_node()
        hidden_row = self.state.rows.get(self._hidden) if self._hidden is not None else None
        if hidden_row is not None and matches(hidden_row, self.filter_text):
            keep, self._hidden = self._hidden, None  # the filter that hid it is gone: back to it
        self.clear()
        self._shown.clear()
        self._fit()
        rows = [r for r in self.state.rows.values() if matches(r, self.filter_text)]
        rows.sort(key=lambda r: sort_value(r, self.sort_column))
        for r in rows:
            c = self._cells(r.info.node_id)
            self._shown[r.info.node_id] = c
            self.put_row(*(_text(c[k]) for k, _ in COLUMNS), key=r.info.node_id)
        if keep is not None and keep in self._shown:
            self.move_cursor(row=self.get_row_index(keep), animate=False)
        elif keep is not None and self._hidden is None:
            self._hidden = keep  # a filter hid the cursor's node: it returns there when the node shows again

    def update_nodes(self, node_ids: Iterable[str], now: float) -> int:
        """Apply changed rows in place; a new node is appended, a gone one removed. The cells written."""
        self.now = now
        written = 0
        grew = False
        for n in node_ids:
            row = self.state.rows.get(n)
            shown = self._shown.get(n)
            if row is None:
                if shown is not None:
                    self.remove_row(n)
                    del self._shown[n]
                continue
            if not matches(row, self.filter_text):
                if shown is not None:
                    self.remove_row(n)
                    del self._shown[n]
                continue
            c = self._cells(n)
            grew = grew or (any(c[k][0].endswith("…") for k in FLEX) and self._outgrew(n))
            if shown is None:
                self._shown[n] = c
                self.put_row(*(_text(c[k]) for k, _ in COLUMNS), key=n)
                continue
            for k, _ in COLUMNS:
                if shown[k] != c[k]:
                    self.put_cell(n, k, _text(c[k]))
                    written += 1
            self._shown[n] = c
        if grew:  # a label longer than its column was fitted to: fit the columns again (rare: not per update)
            self.rebuild(now)
        return written

    def tick(self, now: float) -> int:
        """Ages move on: rewrite the cells whose text changed, for the rows on screen.

        Rows scrolled out of view are brought up to date by the tick after they scroll in
        (at most a second later): recomputing 1,000 rows each second was most of the idle CPU.
        """
        return self.update_nodes(self.visible_nodes(), now)

    def visible_nodes(self) -> list[str]:
        first = max(0, int(self.scroll_y))
        rows = self.ordered_rows[first : first + max(1, self.size.height)]
        return [str(r.key.value) for r in rows if r.key.value is not None]

    def current_node(self) -> str | None:
        if not self._shown or self.row_count == 0:
            return None
        try:
            key = self.coordinate_to_cell_key(self.cursor_coordinate).row_key
        except Exception:  # no row under the cursor
            return None
        return str(key.value) if key.value is not None else None

    def jump_to(self, node_id: str) -> bool:
        if node_id not in self._shown:
            return False
        self.move_cursor(row=self.get_row_index(node_id), animate=False)
        return True


def _text(cell: Cell) -> fmt.Safe:
    return fmt.text((cell[0], STYLES.get(cell[1], "")))
