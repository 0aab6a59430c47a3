"""`emit`: the one place a command chooses between its `--json` document and its text for people.

Every command that prints a result calls `emit(as_json, doc, text)` once:

* `doc` is what scripts read: a protobuf message, or JSON values (dicts,
  lists, strings, numbers) that may hold messages anywhere; each message
  becomes its JSON object by `bc.cli.render.message_to_json` (proto field
  names, every field present, 64-bit integers as numbers). The keys are a
  contract (scripts and the black-box checks read them): add, never rename.
* `text` is what people read: one line (a string, escaped whole) or a
  `bc.cli.output.Lines` of several (a table, a card); nothing when empty.
* `empty`, when given, is said on stderr instead of `text` when `doc` is an
  empty list, so a pipe reading stdout sees nothing at all.

Either side may be a function, called only when that side is printed (a
table is not rendered for `--json`). Both leave through `bc.cli.output`, so
no control character from the fleet reaches the terminal raw: JSON carries
them as `\\u` escapes, text as visible escapes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from google.protobuf.message import Message

from bc.cli.output import Piece, echo, json_lines, json_text
from bc.cli.render import message_to_json

Doc = Any
"""A message, or JSON values that may hold messages."""


def jsonable(value: Doc) -> Any:
    """`value` with every message in it replaced by its JSON object (see `bc.cli.render`)."""
    if isinstance(value, Message):
        return message_to_json(value)
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    return value


def emit(
    as_json: bool,
    doc: Doc | Callable[[], Doc],
    text: Piece | Callable[[], Piece] = "",
    *,
    empty: str = "",
    compact: bool = False,
) -> None:
    """Print `doc` as JSON when `as_json`, else `text` (or `empty` on stderr for an empty list).

    `compact`: the JSON on one line (a stream of documents, as `bc events --follow` prints).
    """
    if as_json:
        value = jsonable(doc() if callable(doc) else doc)
        echo(json_text(value, indent=None) if compact else json_lines(value))
        return
    if empty:
        value = doc() if callable(doc) else doc
        if isinstance(value, list | tuple) and not value:
            echo(empty, err=True)
            return
    shown = text() if callable(text) else text
    if shown:
        echo(shown)


__all__ = ["emit", "jsonable"]
