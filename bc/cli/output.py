"""The one way the CLI writes to the terminal: nothing it prints can steer the terminal.

What `bc` prints comes partly from the fleet: node names, spec strings, event
data, command results, a server's error details. A control character (an
ANSI escape, a carriage return, a newline, a backspace) or a bidirectional
override in any of it could rewrite what an operator sees, so everything
leaves through `echo`, which replaces each such character with a visible
escape (`\\x1b`, `\\x0a`, `\\u202e`). JSON keeps valid: `json_text` writes
them as JSON `\\u` escapes, which parse back to the very same string.

By construction, not by care: `echo` of a string prints exactly one line, a
newline in it included as `\\x0a`. Output of several lines (tables, cards,
JSON documents) is a `Lines` value, built only by `lines(...)` and
`paragraphs(...)` from pieces that are each escaped as one line; the line
breaks between them are the only raw control characters `bc` ever prints.
tests/security/test_sec_esccli_source_rules.py keeps every other way to the
terminal (`print`, `sys.stdout.write`, `click.echo`…) out of `bc/`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any

import click

from bc.protocol.text_safety import is_unsafe, one_line, safe_text

__all__ = [
    "JsonArray",
    "Lines",
    "confirm",
    "echo",
    "json_lines",
    "json_text",
    "lines",
    "one_line",
    "paragraphs",
    "safe_text",
    "text_lines",
]


class Lines:
    """Text of several lines, each one escaped: the only multi-line value `echo` prints.

    Build it with `lines(...)` or `paragraphs(...)`; `str()` joins the lines with newlines (for tests and
    for widths), which is never printed but through `echo`.
    """

    __slots__ = ("_items",)

    def __init__(self, items: Iterable[str] = ()) -> None:
        # Escaped again here whoever built it: escaping an escaped line changes nothing.
        self._items: tuple[str, ...] = tuple(one_line(s) for s in items)

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __bool__(self) -> bool:
        return bool(self._items)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Lines) and other._items == self._items

    def __hash__(self) -> int:
        return hash(self._items)

    def __str__(self) -> str:
        return "\n".join(self._items)

    def __repr__(self) -> str:
        return f"Lines({list(self._items)!r})"


Piece = str | Lines
"""A piece of `lines`/`paragraphs`: a string is one line (whatever it holds), a `Lines` its lines."""


def lines(*pieces: Piece | Iterable[Piece]) -> Lines:
    """One line per string piece (a newline in it shown as `\\x0a`), and the lines of each `Lines` piece.

    An iterable that is neither (a list of rows' strings) contributes each of its pieces in turn.
    """
    out: list[str] = []
    for piece in pieces:
        _add(out, piece)
    return Lines(out)


def _add(out: list[str], piece: Piece | Iterable[Piece]) -> None:
    if isinstance(piece, str):
        out.append(one_line(piece))
    elif isinstance(piece, Lines):
        out.extend(piece)
    else:
        for p in piece:
            _add(out, p)


def paragraphs(*blocks: Piece) -> Lines:
    """The blocks one after another with an empty line between them; empty blocks are left out."""
    out: list[str] = []
    for block in blocks:
        if not block:
            continue
        if out:
            out.append("")
        _add(out, block)
    return Lines(out)


def text_lines(text: str) -> Lines:
    """Text `bc` rendered itself from local values, `\\n` between its lines (the version card, the simulator's
    report): split at `\\n` only, so every other control character stays escaped within its line.

    Never for text that holds what a node or another operator sent: build that with `lines` instead.
    """
    return Lines(text.removesuffix("\n").split("\n"))


def _unsafe(ch: str, keep: str) -> bool:
    return ch not in keep and is_unsafe(ch)


def json_text(value: Any, *, indent: int | None = 2, sort_keys: bool = False) -> str:
    """JSON for scripts: UTF-8 kept readable, but control and bidi characters as `\\uXXXX`."""
    return _json_safe(json.dumps(value, indent=indent, sort_keys=sort_keys, ensure_ascii=False))


def _json_safe(text: str) -> str:
    """JSON text (as `json.dumps(..., ensure_ascii=False)` writes it) with every unsafe character `\\uXXXX`."""
    # Outside strings JSON is ASCII whitespace and punctuation, so every unsafe character is inside one.
    if text.isascii() and "\x7f" not in text:
        return text  # json.dumps escaped every C0 control already
    return "".join(f"\\u{ord(c):04x}" if _unsafe(c, "\n") else c for c in text)


class JsonArray:
    """A JSON array printed as its items arrive (`bc nodes --json` page by page), byte for byte what
    `echo(json_lines(items))` prints for the whole list: `[`, each item indented by two more spaces, `,`
    between them, `]`; `[]` for none.

    Each item comes as JSON text indented for its place (`bc.cli.msg_json.message_json_text(msg, "  ")`,
    as `json.dumps(..., ensure_ascii=False)` writes it); unsafe characters in it are escaped here as
    `json_text` escapes them, so nothing from the fleet reaches the terminal raw (the text's only raw
    control characters are its line breaks).
    """

    def __init__(self) -> None:
        self._count = 0

    def add_texts(self, texts: list[str]) -> None:
        """Items already indented for their place in the array (every line after the first by two spaces)."""
        if not texts:
            return
        head = "[\n  " if self._count == 0 else ",\n  "
        self._count += len(texts)
        click.echo(_json_safe(head + ",\n  ".join(texts)), nl=False)

    def close(self) -> None:
        click.echo("\n]" if self._count else "[]")


def json_lines(value: Any, *, indent: int | None = 2, sort_keys: bool = False) -> Lines:
    """`json_text` as the lines `echo` prints: a string never spans lines in JSON, so each line is whole."""
    return Lines(json_text(value, indent=indent, sort_keys=sort_keys).split("\n"))


def echo(message: Piece = "", *, err: bool = False, nl: bool = True) -> None:
    """Print one line (`message` escaped whole), or the lines of a `Lines`: everything the CLI prints.

    `nl=False` leaves the line open for more of it (a progress line that grows).
    """
    text = str(message) if isinstance(message, Lines) else one_line(message)
    click.echo(text, err=err, nl=nl)


def confirm(question: str, *, err: bool = False) -> bool:
    """`click.confirm` with the question escaped as one line (it names nodes and reasons)."""
    return click.confirm(one_line(question), err=err)
