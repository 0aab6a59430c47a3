"""Which characters must never reach a file the node writes or a terminal an operator reads.

Control characters (C0, DEL, C1: Unicode category Cc), the bidirectional
formatting characters of "Trojan Source" (overrides, embeddings, isolates,
marks) and the line and paragraph separators that editors and terminals treat
as line breaks. Spec validation refuses them; the CLI escapes them.
"""

from __future__ import annotations

import unicodedata

BIDI_AND_SEPARATORS = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u2028\u2029")


def is_unsafe(ch: str) -> bool:
    return ch in BIDI_AND_SEPARATORS or unicodedata.category(ch) == "Cc"


def unsafe_char(text: str) -> str | None:
    """The first character of `text` that must never reach a file or a terminal, or None."""
    return next((ch for ch in text if is_unsafe(ch)), None)
