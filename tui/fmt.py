"""Pure formatting for the TUI: the one way text reaches the screen, ages and unknowns.

Every string the TUI shows may come from a node or an operator (ids, labels, reasons, payloads,
error details): it reaches a widget only as a `Safe`, made here. Making one writes each control
character (C0, DEL, C1), bidirectional override and line separator as a visible escape
(`bc.protocol.text_safety.one_line`: `\\x1b`, `\\u202e`), and a `Safe` is a rich `Text`, which no
widget reads markup in: `[red]x[/]` or `[link=…]` from a node shows as typed. The widgets of
`tui.shown` take nothing else (tests/security/test_sec_esctui_source_rules.py checks the screens).

A value the server did not give shows `n/a`, never a zero that looks healthy.
"""

from __future__ import annotations

from collections.abc import Iterable

from rich.text import Text
from textual.markup import escape as _markup_escape

from bc.protocol.text_safety import one_line

NA = "n/a"

_MADE = object()  # only this module makes a Safe


class Safe:
    """Text made by `tui.fmt`: escaped, markup-free, immutable. `tui.shown`'s widgets show only these."""

    __slots__ = ("_text",)

    def __init__(self, text: Text, made: object) -> None:
        if made is not _MADE:
            raise TypeError("a Safe is made by tui.fmt only (fmt.text, fmt.block, fmt.join)")
        self._text = text

    def rich(self) -> Text:
        """The text to hand to a widget (widgets render it, none changes it: no copy, a table makes thousands)."""
        return self._text

    @property
    def plain(self) -> str:
        return self._text.plain

    def __str__(self) -> str:
        return self._text.plain

    def __repr__(self) -> str:
        return f"Safe({self._text.plain!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Safe) and self._text == other._text

    def __hash__(self) -> int:
        return hash(self._text.plain)

    def __len__(self) -> int:
        return len(self._text.plain)


def flat(value: object) -> str:
    """`value` as one line with every unsafe character escaped: for measuring and comparing what is shown."""
    return one_line(str(value))


def markup(value: object) -> str:
    """For the few Textual APIs that read markup in a str (the command palette): escaped, and its markup too."""
    return _markup_escape(flat(value))


def editable(value: str) -> str:
    """An operator's own text offered for editing (an input box draws its value as it is): kept when it is
    safe to draw, else not offered (empty) rather than drawn raw or changed behind the operator's back."""
    return value if flat(value) == value else ""


def _append(out: Text, part: str | Safe | tuple[str, str]) -> None:
    if isinstance(part, Safe):
        out.append_text(part._text)
    elif isinstance(part, tuple):
        out.append(flat(part[0]), style=part[1] or None)
    else:
        out.append(flat(part))


def text(*parts: str | Safe | tuple[str, str], style: str = "") -> Safe:
    """One line from `parts`: a str is escaped, a (str, style) pair escaped and styled, a Safe kept as made."""
    if len(parts) == 1 and isinstance(parts[0], tuple) and not style:  # a table cell: the common case, made fast
        return Safe(Text(flat(parts[0][0]), style=parts[0][1]), _MADE)
    out = Text(style=style)
    for p in parts:
        _append(out, p)
    return Safe(out, _MADE)


def block(lines: Iterable[str | Safe | tuple[str, str]], *, style: str = "") -> Safe:
    """Lines under each other; each is escaped as one line, so a newline in a value never starts a line."""
    out = Text(style=style)
    for i, line in enumerate(lines):
        if i:
            out.append("\n")
        _append(out, line)
    return Safe(out, _MADE)


def join(sep: str | Safe, parts: Iterable[Safe]) -> Safe:
    out = Text()
    for i, p in enumerate(parts):
        if i:
            _append(out, sep)
        _append(out, p)
    return Safe(out, _MADE)


EMPTY = text()


def age(ms: int | None) -> str:
    """A short age: 42s, 5m, 3h, 2d; None or negative (unknown) is n/a."""
    if ms is None or ms < 0:
        return NA
    s = ms // 1000
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m"
    if s < 86400:
        return f"{s // 3600}h"
    return f"{s // 86400}d"


def count(n: int | None) -> str:
    return NA if n is None else str(n)


def clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(0, width - 1)] + "…"
