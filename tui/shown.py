"""The widgets that show text: each takes only a `tui.fmt.Safe`, so nothing a node or an operator
supplied reaches the terminal unescaped or read as markup.

`Shown` is a static block, `SafeTable` a table, `SafeLog` a log. The screens use these (or Textual's
own widgets with constant text only): tests/security/test_sec_esctui_source_rules.py walks tui/ and
fails on a Static, Label, update, add_row, write or notify fed anything else (`toast` is the notify).
"""

from __future__ import annotations

from rich.text import Text
from textual.notifications import SeverityLevel
from textual.widget import Widget
from textual.widgets import DataTable, RichLog, Static
from textual.widgets.data_table import ColumnKey, RowKey

from tui.fmt import EMPTY, Safe

__all__ = ["SafeLog", "SafeTable", "SeverityLevel", "Shown", "toast"]


def _checked(value: Safe) -> Text:
    if not isinstance(value, Safe):  # mypy says so too; this is for a caller it does not see
        raise TypeError(f"only tui.fmt text is shown, not {type(value).__name__}")
    return value.rich()


class Shown(Static):
    """A Static of fmt-made text, markup off."""

    def __init__(self, content: Safe = EMPTY, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(_checked(content), markup=False, id=id, classes=classes)

    def show(self, content: Safe, *, layout: bool = True) -> None:
        self.update(_checked(content), layout=layout)


class SafeTable(DataTable[Text]):
    """A DataTable whose cells are fmt-made (a str cell would be read as markup by the table)."""

    def put_row(self, *cells: Safe, key: str) -> None:
        self.add_row(*(_checked(c) for c in cells), key=key)

    def put_cell(self, row: str | RowKey, column: str | ColumnKey, value: Safe) -> None:
        self.update_cell(row, column, _checked(value))


class SafeLog(RichLog):
    """A RichLog of fmt-made lines."""

    def say(self, line: Safe) -> None:
        self.write(_checked(line))


def toast(
    node: Widget, message: Safe, *, severity: SeverityLevel = "information", timeout: float | None = None
) -> None:
    """A toast of fmt-made text, markup off."""
    node.notify(_checked(message).plain, severity=severity, timeout=timeout, markup=False)
