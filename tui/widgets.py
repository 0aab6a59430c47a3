"""Small shared widgets: the connection banner, confirm and prompt dialogs, help."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Select, Static, TextArea

from tui import fmt
from tui.shown import Shown
from tui.state import Link


def banner_text(link: Link, server: str, now: float) -> fmt.Safe:
    """What the banner says: the link's notice, if any, then the outage; empty while the stream is live.

    While `bc serve` is away: for how long, why, when the next attempt is, and that the rows on screen
    are stale (as of when). The tick calls this each second, so the times count. The notice, the refusal
    and the outage's reason are the server's words (or an error's): escaped like any other text.
    """
    lines = [link.notice] if link.notice else []
    if not link.live and link.refused:
        lines.append(
            f"bc serve at {server} refused this operator: {link.refused}; the fleet is hidden"
            f" (retrying, attempt {link.attempts})"
        )
    elif not link.live:
        o = link.outage
        if link.data_at is None:
            lines.append(f"connecting to bc serve at {server}…" + (f" {o.describe(server, now)}" if o.down else ""))
        elif o.down:
            age = fmt.age(int((now - link.data_at) * 1000))
            lines.append(f"{o.describe(server, now)}; the rows shown are stale (as of {age} ago)")
        else:
            lines.append(f"reconnecting to bc serve at {server}…")
    return fmt.block(lines)


def rows_stale(link: Link) -> bool:
    """The rows on screen were read from a server that has stopped answering."""
    return not link.live and link.data_at is not None


class Banner(Shown):
    DEFAULT_CSS = """
    Banner { height: auto; background: $error; color: $text; text-style: bold; padding: 0 1; display: none; }
    Banner.shown { display: block; }
    """

    _text = fmt.EMPTY

    def show_text(self, text: fmt.Safe) -> None:
        """Only a change repaints: an unchanged banner each second would lay the screen out again."""
        if text == self._text:
            return
        self._text = text
        self.show(text)
        self.set_class(bool(text.plain), "shown")


class ConfirmScreen(ModalScreen[bool]):
    """A question with what it does spelled out; `y` confirms, `n` or escape does not."""

    BINDINGS = [Binding("y", "answer(True)", "Yes"), Binding("n,escape", "answer(False)", "No")]
    DEFAULT_CSS = """
    ConfirmScreen { align: center middle; }
    ConfirmScreen > Vertical { width: 90; height: auto; border: thick $warning; padding: 1 2; background: $surface; }
    """

    def __init__(self, title: fmt.Safe, body: fmt.Safe) -> None:
        super().__init__()
        self._title, self._body = title, body

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Shown(fmt.text(self._title, style="bold"))
            yield Shown(self._body, id="confirm-body")
            yield Static("y: yes    n: no", classes="hint")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)


class PromptScreen(ModalScreen[str | None]):
    """One line of input; enter submits, escape cancels."""

    BINDINGS = [Binding("escape", "cancel", "Cancel")]
    DEFAULT_CSS = """
    PromptScreen { align: center middle; }
    PromptScreen > Vertical { width: 90; height: auto; border: thick $primary; padding: 1 2; background: $surface; }
    """

    def __init__(self, title: fmt.Safe, value: str = "", placeholder: str = "") -> None:
        super().__init__()
        self._title, self._value, self._placeholder = title, value, placeholder

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Shown(self._title)
            # The operator's own text to edit (a path given to --approver-key), offered only if safe to draw.
            yield Input(value=fmt.editable(self._value), placeholder=fmt.editable(self._placeholder), id="prompt-input")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value)

    def action_cancel(self) -> None:
        self.dismiss(None)


HELP = """bc tui: the live fleet view (a client of the Admin API; it never opens the store)

Screens    1 fleet   2 approvals   3 jobs   4 reservations   5 commands   6 events   7 health
Anywhere   ? help    ctrl+p find a node, DAG or batch    q quit
Fleet      / filter   s sort (cycles columns)   enter node detail   g jump to a node
Node       c cordon   u uncordon   r run a command   escape back
Approvals  a approve  x reject (your approver key file is read for each signature)
Jobs       c cancel the DAG under the cursor
Reservations  d release    Commands  enter open   k cancel    Events  / filter

n/a means the server did not say; it is never shown as zero. A red banner means the
stream is down: it says how old the data on screen is, and the view resumes by itself
from the last event it applied, with nothing missed and nothing shown twice.
"""


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,question_mark", "close", "Close")]
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > Static { width: 96; height: auto; border: thick $primary; padding: 1 2; background: $surface; }
    """

    def compose(self) -> ComposeResult:
        yield Shown(fmt.block(HELP.split("\n")))

    def action_close(self) -> None:
        self.dismiss(None)


class RunCommandScreen(ModalScreen[tuple[str, str] | None]):
    """The kind picker and the payload editor of `r` on a node; ctrl+s goes on (to the confirmation)."""

    BINDINGS = [Binding("ctrl+s", "submit", "Next"), Binding("escape", "cancel", "Cancel")]
    DEFAULT_CSS = """
    RunCommandScreen { align: center middle; }
    RunCommandScreen > Vertical { width: 90; height: 24; border: thick $primary; padding: 1 2; background: $surface; }
    RunCommandScreen TextArea { height: 1fr; }
    """

    def __init__(self, node_id: str, kinds: list[tuple[str, str]]) -> None:
        super().__init__()
        self._node, self._kinds = node_id, kinds

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Shown(fmt.text(f"run a command on {self._node}: the kind, then its payload (protobuf JSON)"))
            yield Select(self._kinds, value=self._kinds[0][1], allow_blank=False, id="run-kind")
            yield TextArea("{}", id="run-payload")
            yield Static("ctrl+s: next (you confirm before anything runs)    escape: cancel", markup=False)

    def action_submit(self) -> None:
        kind = self.query_one("#run-kind", Select).value
        self.dismiss((str(kind), self.query_one("#run-payload", TextArea).text))

    def action_cancel(self) -> None:
        self.dismiss(None)
