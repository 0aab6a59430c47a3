"""Which characters must never reach a file the node writes or a terminal an operator reads.

Control characters (C0, DEL, C1: Unicode category Cc), the bidirectional
formatting characters of "Trojan Source" (overrides, embeddings, isolates,
marks) and the line and paragraph separators that editors and terminals treat
as line breaks. Spec validation refuses them; the CLI and the servers' error
details escape them (`safe_text`, `one_line`), so what an operator reads is
exactly what was sent, made visible.
"""

from __future__ import annotations

import unicodedata

BIDI_AND_SEPARATORS = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u2028\u2029")


def is_unsafe(ch: str) -> bool:
    return ch in BIDI_AND_SEPARATORS or unicodedata.category(ch) == "Cc"


def unsafe_char(text: str) -> str | None:
    """The first character of `text` that must never reach a file or a terminal, or None."""
    return next((ch for ch in text if is_unsafe(ch)), None)


def _escape(ch: str) -> str:
    n = ord(ch)
    return f"\\x{n:02x}" if n < 0x100 else f"\\u{n:04x}"


def safe_text(text: str, *, keep: str = "\n\t") -> str:
    """`text` with every unsafe character but those in `keep` written as a visible escape (`\\x1b`)."""
    if text.isascii() and text.isprintable():
        return text  # the common case, at C speed
    return "".join(_escape(c) if c not in keep and is_unsafe(c) else c for c in text)


def one_line(text: str) -> str:
    """`text` for one table cell or one error line: newlines and tabs escaped as well."""
    return safe_text(text, keep="")
