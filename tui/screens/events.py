"""Events: the live log, newest at the bottom, with a filter; `security.*` events stand out."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import Input

from bc.client.fmt import format_time_ms
from bc.protocol.pb import admin_pb2
from tui import fmt
from tui.screens.base import BcScreen
from tui.shown import SafeLog, Shown

SHOWN = 1000


def line(ev: admin_pb2.EventRecord) -> fmt.Safe:
    security = ev.type.startswith("security.")
    return fmt.text(
        f"{ev.seq:>8} {format_time_ms(ev.at_ms)} ",
        (f"{fmt.flat(ev.type):<28}", "bold reverse" if security else "bold"),
        f" {fmt.flat(ev.subject):<28} ",
        (ev.data_json, "bold" if security else ""),
        style="dim",
    )


def shows(ev: admin_pb2.EventRecord, text: str) -> bool:
    hay = f"{ev.type} {ev.subject} {ev.data_json}".lower()
    return all(w in hay for w in text.lower().split())


class EventsScreen(BcScreen):
    AUTO_FOCUS = "#events-log"
    BINDINGS = [Binding("slash", "filter", "Filter"), Binding("escape", "clear", "Clear filter", show=False)]
    DEFAULT_CSS = """
    #events-status { height: 1; padding: 0 1; color: $text-muted; }
    #events-filter { display: none; }
    #events-filter.shown { display: block; }
    """

    def __init__(self) -> None:
        super().__init__()
        self.filter_text = ""

    def body(self) -> ComposeResult:
        yield Shown(id="events-status")
        yield Input(placeholder="filter: words in type, subject or data", id="events-filter")
        yield SafeLog(id="events-log", max_lines=SHOWN, wrap=False, auto_scroll=True)

    def on_mount(self) -> None:
        super().on_mount()
        self._refill()

    def _refill(self) -> None:
        log = self.query_one(SafeLog)
        log.clear()
        matching = [ev for ev in self.bc.state.events if shows(ev, self.filter_text)]
        self._shown = len(matching)
        for ev in matching[-SHOWN:]:
            log.say(line(ev))
        self._status()

    _shown = 0

    def feed_event(self, ev: admin_pb2.EventRecord) -> None:
        if shows(ev, self.filter_text):
            self._shown += 1
            self.query_one(SafeLog).say(line(ev))
        self._status()

    def _status(self) -> None:
        """The filter in force, always on screen: a log with lines missing says why."""
        total = len(self.bc.state.events)
        text = (
            f"filter: {self.filter_text!r} ({self._shown} of {total} events shown) · / to change, escape to clear"
            if self.filter_text
            else f"{total} events · / to filter"
        )
        self.query_one("#events-status", Shown).show(fmt.text(text))

    def action_filter(self) -> None:
        box = self.query_one("#events-filter", Input)
        box.add_class("shown")
        box.value = self.filter_text  # the filter in force, to edit (an old draft would apply it again unseen)
        box.focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.filter_text = event.value.strip()
        event.input.remove_class("shown")
        self._refill()

    def action_clear(self) -> None:
        self.query_one("#events-filter", Input).remove_class("shown")
        self.filter_text = ""
        self._refill()
