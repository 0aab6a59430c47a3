"""Column widths from the terminal's: free text gets the room the other columns leave, not a fixed clip.

Pure: the screens pass the width they have and the texts they would show. When everything fits,
every column is as wide as its longest text; when not, the fixed columns (ids, states, counts,
ages) keep theirs and the free-text ones share what is left, each at least `FLOOR` and none more
than it needs (the room one needs less of goes to the others).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

FLOOR = 8  # a free-text column is never narrower than this, even on a narrow terminal
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
