"""What every screen shares: the banner on top, the footer below, and the app's state and connection."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar, cast

from textual.app import ComposeResult
from textual.screen import Screen
from textual.widgets import Footer

from bc.errors import BcError
from bc.protocol.pb import admin_pb2
from tui import fmt
from tui.shown import SeverityLevel, toast
from tui.source import Source
from tui.widgets import Banner, banner_text, rows_stale

if TYPE_CHECKING:
    from tui.app import BcTui

_T = TypeVar("_T")


class BcScreen(Screen[None]):
    """A screen of the app. Subclasses compose `body()` and react to `feed_event` / `nodes_changed`."""

    DEFAULT_CSS = """
    BcScreen.-stale DataTable, BcScreen.-stale RichLog, BcScreen.-stale VerticalScroll { text-opacity: 55%; }
    """

    # Event type prefixes after which the screen reads its data again (while it is shown).
    RELOAD_ON: tuple[str, ...] = ()

    def compose(self) -> ComposeResult:
        yield Banner(id="banner")
        yield from self.body()
        yield Footer()

    def body(self) -> ComposeResult:
        yield from ()

    @property
    def bc(self) -> BcTui:
        return cast("BcTui", self.app)

    def on_mount(self) -> None:
        # Textual calls this handler for each class that defines one and the subclasses call it too: a screen
        # listed twice wrote each event twice, and outlived its unmount in the list (then the banner's update
        # of a screen no longer mounted raised in the feed's worker and stopped it: the TUI froze).
        if self not in self.bc.views:
            self.bc.views.append(self)
        self.show_link()

    def on_unmount(self) -> None:
        self.bc.views[:] = [v for v in self.bc.views if v is not self]

    def on_screen_resume(self) -> None:
        self.show_link()
        self.stale = False
        self.spawn(self.reload, "reload")

    stale = False
    _width = 0

    def on_resize(self) -> None:
        # The tables size their free-text columns to the terminal: a new width, a new layout.
        if self.size.width != self._width:
            if self._width and self.is_current:
                self.spawn(self.reload, "reload")
            self._width = self.size.width

    def spawn(self, fn: Callable[[], Awaitable[None]], group: str) -> None:
        """Run `fn` as this screen's worker, replacing the one of the same group (a newer read wins).

        A callable, not a coroutine: a worker replaced before it started leaves no coroutine unawaited.
        """
        self.run_worker(fn, group=group, exclusive=True)

    def show_link(self) -> None:
        link = self.bc.state.link
        self.query_one(Banner).show_text(banner_text(link, self.bc.server, self.bc.clock.monotonic()))
        # Stale rows are drawn faded (and the banner says so) until the server answers again.
        self.set_class(rows_stale(link), "-stale")

    def tick(self, now: float) -> None:
        self.show_link()

    def feed_event(self, ev: admin_pb2.EventRecord) -> None:
        if self.RELOAD_ON and ev.type.startswith(self.RELOAD_ON):
            if self.is_current:
                self.spawn(self.reload, "reload")
            else:
                self.stale = True

    def nodes_changed(self, node_ids: set[str]) -> None:
        pass

    async def reload(self) -> None:
        pass

    def source(self) -> Source | None:
        src = self.bc.feed.source
        if src is None:
            self.notify("not connected to bc serve; try again once the banner is gone", severity="error")
        return src

    def tell(self, message: fmt.Safe, *, severity: SeverityLevel = "information", timeout: float | None = None) -> None:
        """A notification (ids, states and error details are the server's words: fmt-made, like all text)."""
        toast(self, message, severity=severity, timeout=timeout)

    async def call(self, what: str, aw: Awaitable[_T]) -> _T | None:
        """Await a write, telling the operator how it went in one line."""
        try:
            out = await aw
        except BcError as e:
            self.tell(fmt.text(f"{what}: {e.message}"), severity="error", timeout=8)
            return None
        return out
