"""Jobs: each DAG as a card with its node chain; the running node stands out; `c` cancels (confirmed)."""

from __future__ import annotations

from functools import partial

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll

from bc.errors import BcError
from bc.protocol.pb import admin_pb2
from tui import fmt
from tui.screens.base import BcScreen
from tui.shown import Shown
from tui.widgets import ConfirmScreen

MARKS = {"done": "✓", "running": "●", "failed": "✗", "queued": "·", "cancelled": "⊘"}


def card(job: admin_pb2.JobInfo, selected: bool) -> fmt.Safe:
    done = sum(1 for n in job.nodes if n.state == "done")
    who = job.requested_by or "control plane"
    head = fmt.text(
        ("▶ " if selected else "  ") + job.id,
        (f"  {job.template}  {job.state}", "bold reverse" if job.state == "failed" else "bold"),
        f"  {done}/{len(job.nodes)} done",
        ("  cancel requested" if job.cancel_requested and not job.terminal else "", "bold"),
        (f"  by {who}" + (f": {job.reason}" if job.reason else ""), "dim"),
        style="bold" if selected else "",
    )
    style = {"running": "bold reverse", "failed": "bold underline", "done": "", "cancelled": "dim"}
    chain = fmt.text(
        "    ",
        fmt.join(
            fmt.text((" ▸ ", "dim")),
            (
                fmt.text(
                    (
                        f"{MARKS.get(n.state, '?')} {n.kind}" + (f"[{n.subject}]" if n.subject else ""),
                        style.get(n.state, "dim"),
                    )
                )
                for n in job.nodes
            ),
        ),
    )
    lines = [head, chain]
    for a in job.awaiting_approval:
        # Not just "Batch ●": which batch the approvers are asked to sign, and how far they got.
        lines.append(fmt.text((f"    awaiting approval: batch {a.batch_id}, {a.signed} of {a.needed} signed", "bold")))
    if job.first_error:
        lines.append(fmt.text((f"    error: {job.first_error}", "bold")))
    return fmt.block(lines)


class JobsScreen(BcScreen):
    AUTO_FOCUS = "#job-cards"
    RELOAD_ON = ("job.",)  # job.approval too: a signature on one of its batches
    BINDINGS = [
        Binding("down,j", "move(1)", "Next", show=False),
        Binding("up,k", "move(-1)", "Previous", show=False),
        Binding("c", "cancel_job", "Cancel DAG"),
        Binding("r", "refresh", "Refresh"),
    ]
    DEFAULT_CSS = """
    #job-cards > Static { margin: 0 0 1 0; }
    #jobs-pools { height: 1; padding: 0 1; color: $text-muted; }
    """

    def __init__(self) -> None:
        super().__init__()
        self.jobs: list[admin_pb2.JobInfo] = []
        self.selected = 0

    def body(self) -> ComposeResult:
        yield Shown(id="jobs-pools")
        yield VerticalScroll(id="job-cards")

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "cancel_job":
            return self.bc.role != "viewer"
        return True

    async def reload(self) -> None:
        src = self.bc.feed.source
        if src is None:
            return
        try:
            resp = await src.list_jobs()
        except BcError as e:
            self.tell(fmt.text(f"jobs: {e.message}"), severity="error")
            return
        cur = self.current()
        keep = cur.id if cur is not None else None
        # Newest first: the DAG an operator just started is on top.
        self.jobs = sorted(resp.jobs, key=lambda j: (j.terminal, -j.created_at_ms, j.id))
        self.bc.known_jobs = {j.id: j for j in self.jobs}
        ids = [j.id for j in self.jobs]
        self.selected = ids.index(keep) if keep in ids else min(self.selected, max(0, len(ids) - 1))
        pools = "  ".join(f"{p.name} {p.held}/{p.capacity}" for p in resp.pools) or "none"
        self.query_one("#jobs-pools", Shown).show(fmt.text(f"{len(self.jobs)} DAGs · slot pools: {pools}"))
        await self._draw()

    async def _draw(self) -> None:
        box = self.query_one("#job-cards", VerticalScroll)
        await box.remove_children()
        if not self.jobs:
            await box.mount(Shown(fmt.text("no DAGs")))
            return
        await box.mount_all(Shown(card(j, i == self.selected), id=f"job-{i}") for i, j in enumerate(self.jobs))

    def current(self) -> admin_pb2.JobInfo | None:
        return self.jobs[self.selected] if 0 <= self.selected < len(self.jobs) else None

    def select(self, dag_id: str) -> None:
        ids = [j.id for j in self.jobs]
        if dag_id in ids:
            self.selected = ids.index(dag_id)
            self.spawn(self._draw, "render")

    async def action_move(self, by: int) -> None:
        if self.jobs:
            self.selected = max(0, min(len(self.jobs) - 1, self.selected + by))
            for i, j in enumerate(self.jobs):
                self.query_one(f"#job-{i}", Shown).show(card(j, i == self.selected))
            self.query_one(f"#job-{self.selected}", Shown).scroll_visible()

    def action_refresh(self) -> None:
        self.spawn(self.reload, "reload")

    def action_cancel_job(self) -> None:
        job = self.current()
        if job is not None:
            self.spawn(partial(self._cancel, job), "cancel")

    async def _cancel(self, job: admin_pb2.JobInfo) -> None:
        if job.terminal:
            self.tell(fmt.text(f"{job.id} is already {job.state}"))
            return
        src = self.source()
        if src is None:
            return
        running = [f"{n.kind}[{n.subject}]" for n in job.nodes if n.state == "running"]
        body = fmt.block(
            [
                f"DAG {job.id} ({job.template} on {', '.join(job.subjects) or 'no subjects'})",
                f"queued nodes are cancelled; running ones are asked to stop: {', '.join(running) or 'none running'}",
            ]
        )
        if not await self.app.push_screen_wait(ConfirmScreen(fmt.text(f"Cancel DAG {job.id}?"), body)):
            return
        out = await self.call(f"cancel {job.id}", src.cancel_job(job.id))
        if isinstance(out, admin_pb2.CancelJobResponse):
            self.tell(
                fmt.text(
                    f"{job.id}: {'cancelled' if out.cancelled else 'nothing left to cancel'}; it is {out.job.state}"
                )
            )
        await self.reload()

    def refresh_error(self, e: BcError) -> None:
        self.tell(fmt.text(e.message), severity="error")
