"""The one way the CLI writes to the terminal: nothing it prints can steer the terminal.

What `bc` prints comes partly from the fleet: node names, spec strings, event
data, command results, a server's error details. A control character (an
ANSI escape, a carriage return, a backspace) or a bidirectional override in
any of it could rewrite what an operator sees, so every line leaves through
`echo`, which replaces each such character with a visible escape (`\\x1b`,
`\\u202e`). JSON keeps valid: `json_text` writes them as JSON `\\u` escapes,
which parse back to the very same string.

Newlines and tabs that our own rendering puts between lines and columns
stay; inside a table cell or a one-line error, `one_line` escapes them too.
"""

from __future__ import annotations

import json
from typing import Any

import click

from bc.protocol.text_safety import is_unsafe, one_line, safe_text

__all__ = ["echo", "json_text", "one_line", "safe_text"]


def _unsafe(ch: str, keep: str) -> bool:
    return ch not in keep and is_unsafe(ch)


def json_text(value: Any, *, indent: int | None = 2, sort_keys: bool = False) -> str:
    """JSON for scripts: UTF-8 kept readable, but control and bidi characters as `\\uXXXX`."""
    text = json.dumps(value, indent=indent, sort_keys=sort_keys, ensure_ascii=False)
    # Outside strings JSON is ASCII whitespace and punctuation, so every unsafe character is inside one.
    if text.isascii() and "\x7f" not in text:
        return text  # json.dumps escaped every C0 control already
    return "".join(f"\\u{ord(c):04x}" if _unsafe(c, "\n") else c for c in text)


def echo(message: str = "", *, err: bool = False, nl: bool = True) -> None:
    """`click.echo` for everything the CLI prints."""
    click.echo(safe_text(message), err=err, nl=nl)
