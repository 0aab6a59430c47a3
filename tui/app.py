"""`BcTui`: the app. It owns the state, runs the feed as a worker, and routes the feed's news to screens.

Screens are modes (1-9) so each keeps its cursor while another is shown; a node's detail is
pushed over the fleet. The clock is injected: the ages on screen and the banner's data age
read it, so a test freezes it and a snapshot never drifts.
"""

from __future__ import annotations

from textual.app import App
from textual.binding import Binding

from bc.protocol.pb import admin_pb2
from bc.seams.clock import Clock
from tui.feed import Feed, Listener
from tui.palette import FindProvider
from tui.screens.approvals import ApprovalsScreen
from tui.screens.base import BcScreen
from tui.screens.commands import CommandsScreen
from tui.screens.events import EventsScreen
from tui.screens.fleet import FleetScreen
from tui.screens.health import HealthScreen
from tui.screens.jobs import JobsScreen
from tui.screens.machines import MachinesScreen
from tui.screens.node import NodeScreen
from tui.screens.reservations import ReservationsScreen
from tui.screens.tunnels import TunnelsScreen
from tui.source import Connect
from tui.state import FleetState
from tui.widgets import HelpScreen


class BcTui(App[None]):
    TITLE = "bc tui"
    MODES = {
        "fleet": FleetScreen,
        "approvals": ApprovalsScreen,
        "jobs": JobsScreen,
        "reservations": ReservationsScreen,
        "commands": CommandsScreen,
        "events": EventsScreen,
        "health": HealthScreen,
        "tunnels": TunnelsScreen,
        "machines": MachinesScreen,
    }
    BINDINGS = [
        Binding("1", "switch_mode('fleet')", "Fleet"),
        Binding("2", "switch_mode('approvals')", "Approvals"),
        Binding("3", "switch_mode('jobs')", "Jobs"),
        Binding("4", "switch_mode('reservations')", "Reservations"),
        Binding("5", "switch_mode('commands')", "Commands"),
        Binding("6", "switch_mode('events')", "Events"),
        Binding("7", "switch_mode('health')", "Health"),
        Binding("8", "switch_mode('tunnels')", "Tunnels"),
        Binding("9", "switch_mode('machines')", "Machines"),
        Binding("question_mark", "help", "Help"),
        Binding("q", "quit", "Quit"),
    ]
    COMMANDS = App.COMMANDS | {FindProvider}

    def __init__(
        self,
        connect: Connect,
        clock: Clock,
        *,
        server: str,
        approver_key: str | None = None,
        poll_s: float = 5.0,
        tick_s: float = 1.0,
        theme: str = "ansi-dark",
    ) -> None:
        super().__init__()
        # The ANSI theme draws with the terminal's own 16 colours, so the app follows the terminal's theme;
        # styles also use bold, reverse and dim, so nothing depends on colour alone (NO_COLOR stays legible).
        self._theme = theme
        self.clock = clock
        self.server = server
        self.approver_key = approver_key
        self.state = FleetState()
        self.views: list[BcScreen] = []
        self.known_jobs: dict[str, admin_pb2.JobInfo] = {}
        self.known_batches: dict[str, admin_pb2.BatchInfo] = {}
        self._tick_s = tick_s
        listener = Listener(self._nodes_changed, self._event, self._link_changed)
        self.feed = Feed(connect, clock, self.state, listener, poll_s=poll_s)

    @property
    def role(self) -> str:
        return self.state.server.role

    def on_mount(self) -> None:
        self.theme = self._theme
        self.switch_mode("fleet")
        self.run_worker(self.feed.run(), name="feed", group="feed", exit_on_error=False)
        if self._tick_s > 0:
            self.set_interval(self._tick_s, self._tick)

    def _tick(self) -> None:
        # A mode switch makes its new screen current before the screen has composed its widgets: a tick in
        # between found no banner, and the exception stopped the whole app (a frozen TUI).
        screen = self.screen
        if isinstance(screen, BcScreen) and screen.is_mounted:
            screen.tick(self.clock.monotonic())

    def _live_views(self) -> list[BcScreen]:
        """The screens to tell, mounted ones only: the feed calls in here, and a screen gone must not stop it."""
        return [v for v in self.views if v.is_attached and v.is_mounted]

    def _nodes_changed(self, node_ids: set[str]) -> None:
        for v in self._live_views():
            v.nodes_changed(node_ids)

    def _event(self, ev: admin_pb2.EventRecord) -> None:
        for v in self._live_views():
            v.feed_event(ev)

    def _link_changed(self) -> None:
        live = self.state.link.live
        for v in self._live_views():
            v.show_link()
            if not live:
                continue
            if v.is_current:
                v.spawn(v.reload, "reload")  # back after an outage: read again now, not at the next event
            else:
                v.stale = True
        self.refresh_bindings()

    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    def open_node(self, node_id: str) -> None:
        self.push_screen(NodeScreen(node_id))

    def goto(self, what: str, ident: str) -> None:
        if what == "node":
            self.switch_mode("fleet")
            self.open_node(ident)
        elif what == "DAG":
            self.switch_mode("jobs")
            screen = self.screen
            if isinstance(screen, JobsScreen):
                screen.select(ident)
        elif what == "batch":
            self.switch_mode("approvals")
