"""Attack (on the operator's terminal): a node or an operator puts terminal controls, bidi overrides or Rich
markup in any string the TUI shows (a node id, a label, a reason, a payload, an event's data, an error): a
U+202E reorders the approval dialog an approver signs from, an OSC sequence retitles or rewrites the terminal,
`[link=…]` plants a hyperlink, an unclosed `[` stops the app.

Every string the fake source serves is made hostile (tests/strategies.py's HOSTILE_TEXT and markup), and every
screen is opened with Textual's pilot: fleet, the command palette, a node with its cordon and run-command
dialogs, approvals with the approval dialog, jobs, reservations, commands with a command open, events,
machines, the banner and an error toast. On each, no C0, C1 or bidi character is in what the screens draw
(their rendered strips, what the terminal is sent), no hyperlink is drawn, and the markup shows as typed.
"""

from __future__ import annotations

from textual.pilot import Pilot

from bc.errors import NotFound
from bc.protocol.pb import admin_pb2
from tests.security.esctui_helpers import MARKUP, SEEN_AS_TYPED, HostileSource, links_drawn, screen_text, unsafe_drawn
from tests.tui.conftest import until
from tui.app import BcTui
from tui.fake import FrozenClock
from tui.fleet_table import FleetTable
from tui.screens.approvals import ApprovalsScreen
from tui.screens.commands import CommandsScreen
from tui.screens.jobs import JobsScreen
from tui.screens.machines import MachinesScreen
from tui.screens.node import NodeScreen
from tui.screens.reservations import ReservationsScreen
from tui.widgets import ConfirmScreen, PromptScreen, RunCommandScreen

SIZE = (200, 60)
SERVER = "h\u202e:1[red]"  # the operator's own config names the server; the banner says it


class RefusingSource(HostileSource):
    async def release(self, reservation_id: str) -> admin_pb2.Reservation:
        raise NotFound(f"no reservation {reservation_id} (\x1b]0;owned\x07 a\u202eb [link=https://evil.example]x)")


def check(app: BcTui, where: str, *, markup_shown: bool = True) -> list[str]:
    """What is wrong with what the screens draw now (every screen is looked at before the test says)."""
    wrong = []
    raw = unsafe_drawn(app)
    if raw:
        wrong.append(f"{where}: drawn raw: {raw[:3]}")
    links = links_drawn(app)
    if links:
        wrong.append(f"{where}: a hyperlink from data was drawn: {links[:3]}")
    if markup_shown and not any(m in screen_text(app) for m in MARKUP):
        wrong.append(f"{where}: no markup shown as typed")
    return wrong


async def modal(pilot: Pilot[None], app: BcTui, kind: type) -> None:
    await until(pilot, lambda: isinstance(app.screen, kind), what=f"{kind.__name__} is open")
    await pilot.pause(0.1)


async def test_no_tui_screen_draws_a_control_bidi_or_markup_from_hostile_data() -> None:
    source = RefusingSource()
    app = BcTui(source.connect, FrozenClock(), server=SERVER, approver_key="/no/such.key", poll_s=3600, tick_s=0)
    wrong: list[str] = []
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        table = app.screen.query_one(FleetTable)
        await until(pilot, lambda: app.state.link.live and table.row_count == len(source.nodes))
        await until(pilot, lambda: all(r.detail for r in app.state.rows.values()), what="every node's detail read")
        await pilot.pause(0.2)
        wrong += check(app, "fleet")

        await pilot.press("ctrl+p", "n")  # the palette finds nodes, DAGs and batches by id
        await pilot.pause(0.5)
        wrong += check(app, "command palette", markup_shown=False)
        await pilot.press("escape")
        await pilot.pause(0.1)

        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, NodeScreen))
        await until(pilot, lambda: "SECTIONS" in screen_text(app), what="the node's detail")
        wrong += check(app, "node")
        await pilot.press("c")
        await modal(pilot, app, ConfirmScreen)
        wrong += check(app, "cordon dialog")
        await pilot.press("n")
        await until(pilot, lambda: isinstance(app.screen, NodeScreen))
        await pilot.press("r")
        await modal(pilot, app, RunCommandScreen)
        wrong += check(app, "run-command dialog", markup_shown=False)
        await pilot.press("escape")
        await until(pilot, lambda: isinstance(app.screen, NodeScreen))
        await pilot.press("escape")

        await pilot.press("2")
        await until(pilot, lambda: isinstance(app.screen, ApprovalsScreen) and len(app.screen.batches) == 1)
        await pilot.pause(0.2)
        wrong += check(app, "approvals")
        await pilot.press("a")
        await modal(pilot, app, PromptScreen)
        wrong += check(app, "approver key prompt", markup_shown=False)
        await pilot.press("enter")
        await modal(pilot, app, ConfirmScreen)
        wrong += check(app, "approval dialog")
        shown = screen_text(app)
        for typed in SEEN_AS_TYPED:  # what the approver signs from, as the requester typed it, made visible
            if typed not in shown:
                wrong.append(f"the approval dialog does not show {typed!r} as typed")
        await pilot.press("n")
        await until(pilot, lambda: "did not approve" in screen_text(app), what="the toast")
        wrong += check(app, "approvals toast")

        await pilot.press("3")
        await until(pilot, lambda: isinstance(app.screen, JobsScreen) and len(app.screen.jobs) == len(source.jobs))
        await pilot.pause(0.2)
        wrong += check(app, "jobs")
        await pilot.press("c")
        await modal(pilot, app, ConfirmScreen)
        wrong += check(app, "cancel-DAG dialog")
        await pilot.press("n")

        await pilot.press("4")
        await until(pilot, lambda: isinstance(app.screen, ReservationsScreen) and len(app.screen.by_id) == 2)
        await pilot.pause(0.2)
        wrong += check(app, "reservations")
        await pilot.press("d")
        await modal(pilot, app, ConfirmScreen)
        wrong += check(app, "release dialog")
        await pilot.press("y")  # the server refuses, in words a node chose: the toast escapes them
        await until(pilot, lambda: "no reservation" in screen_text(app), what="the refusal's toast")
        wrong += check(app, "refusal toast")

        await pilot.press("5")
        await until(pilot, lambda: isinstance(app.screen, CommandsScreen) and len(app.screen.commands) > 0)
        await pilot.pause(0.2)
        wrong += check(app, "commands")
        await pilot.press("enter")
        await until(pilot, lambda: "idempotency key" in screen_text(app), what="the command's detail")
        wrong += check(app, "command detail")
        await pilot.press("k")
        await modal(pilot, app, ConfirmScreen)
        wrong += check(app, "cancel-command dialog")
        await pilot.press("n")

        await pilot.press("6")
        await pilot.pause(0.3)
        wrong += check(app, "events")

        await pilot.press("9")
        await until(
            pilot, lambda: isinstance(app.screen, MachinesScreen) and len(app.screen.machines) == len(source.machines)
        )
        await pilot.pause(0.2)
        wrong += check(app, "machines")

        link = app.state.link  # the banner: the server's notice, its refusal, the outage, the server's name
        link.live, link.data_at = False, app.clock.monotonic()
        link.notice = "closed: \x1b[2J a\u202eb [link=https://evil.example]x[/link]"
        link.refused = "revoked \x9b31m [red]x[/]"
        app.screen.show_link()  # type: ignore[attr-defined]
        await until(pilot, lambda: "refused this operator" in screen_text(app), what="the banner")
        wrong += check(app, "banner")
        if "h\\u202e:1[red]" not in screen_text(app):
            wrong.append("the banner does not name the server as configured, escaped")
        await pilot.press("q")
    assert not wrong, "\n".join(wrong)
