"""Column widths from the terminal's: free text gets the room the other columns leave, not a fixed clip.

Pure: the screens pass the width they have and the texts they would show. When everything fits,
every column is as wide as its longest text; when not, the fixed columns (ids, states, counts,
ages) keep theirs and the free-text ones share what is left, each at least `FLOOR` and none more
than it needs (the room one needs less of goes to the others).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence

from tui import fmt
from tui.shown import SafeTable

FLOOR = 12  # a free-text column is never narrower than this, even on a narrow terminal
PADDING = 2  # a DataTable cell's padding, one each side
SCROLLBAR = 2  # the table's vertical scrollbar


def natural(title: str, texts: Iterable[str]) -> int:
    """The width a column needs to show its title and every text whole."""
    return max([len(title), *(len(t) for t in texts)])


def share(spare: int, wants: Mapping[str, int], floor: int = FLOOR) -> dict[str, int]:
    """Widths for the free-text columns out of `spare` cells: each what it wants when all fit, else fair shares."""
    if sum(wants.values()) <= spare:
        return dict(wants)
    widths = {k: min(w, floor) for k, w in wants.items()}
    left = spare - sum(widths.values())
    growing = sorted((k for k in wants if wants[k] > widths[k]), key=lambda k: wants[k])
    while left > 0 and growing:
        each = max(1, left // len(growing))
        for k in list(growing):
            add = min(each, wants[k] - widths[k], left)
            widths[k] += add
            left -= add
            if widths[k] >= wants[k]:
                growing.remove(k)
            if left <= 0:
                break
    return widths


def fit(width: int, fixed: Mapping[str, int], wants: Mapping[str, int], floor: int = FLOOR) -> dict[str, int]:
    """The free-text columns' widths in a table `width` cells wide whose other columns need `fixed`."""
    used = sum(w + PADDING for w in fixed.values()) + PADDING * len(wants) + SCROLLBAR
    return share(max(0, width - used), wants, floor)


def sized(width: int, titles: Sequence[str], rows: Sequence[Sequence[str]], flex: Collection[int]) -> list[list[str]]:
    """`rows` with the free-text cells (the column indexes in `flex`) clipped to fit a table `width` wide.

    Each cell is measured as it will show, its unsafe characters escaped (`fmt.flat`): a `\\u202e` takes six cells.
    """
    rows = [[fmt.flat(c) for c in r] for r in rows]
    need = [natural(t, (r[i] for r in rows)) for i, t in enumerate(titles)]
    widths = fit(width, {str(i): need[i] for i in range(len(titles)) if i not in flex}, {str(i): need[i] for i in flex})
    return [[fmt.clip(c, widths[str(i)]) if i in flex else c for i, c in enumerate(r)] for r in rows]


def refill(table: SafeTable, rows: Sequence[Sequence[str]], keys: Sequence[str]) -> None:
    """Clear `table` and add `rows`, its columns as wide as what they now hold (a column only ever grows
    as rows are added: after a narrower terminal or shorter texts it would stay as wide as it once was)."""
    table.clear()
    for column in table.columns.values():
        column.content_width = column.label.cell_len
    for row, key in zip(rows, keys, strict=True):
        table.put_row(*(fmt.text(c) for c in row), key=key)
