"""Health: what the health reconciler sees and does (docs/health.md), from the one read `bc health` makes.

The limits used on top (nodes in remediation of the cap, automatic actions this hour of the cap, the
policy's version), then one table: the sick GPUs and nodes with the rule and action the policy gives each,
the queue with why each waits, the running remediations with their job, and the GPU cordons (quarantined
or a person's). `GetHealth` is the same call `bc health` makes (`bc.control.reads.health.health`); every
string a node reported (a reason, a message) is fmt-made, so it reaches the terminal escaped.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding

from bc.client.fmt import format_time_ms
from bc.errors import BcError
from bc.protocol.pb import admin_pb2
from tui import columns, fmt
from tui.screens.base import BcScreen
from tui.shown import SafeTable, Shown

HEALTH_COLUMNS = ("GROUP", "NODE", "GPU", "STATE", "RULE / ACTION", "JOB", "SINCE", "WHY")


def limits_text(h: admin_pb2.HealthInfo) -> str:
    lim = h.limits
    version = f"policy v{h.policy_version}" if h.policy_version else "no policy set (nothing acts)"
    label = f", one per {lim.per_label}" if lim.per_label else ""
    state = "" if h.enabled else " · disabled: nothing new starts"
    return (
        f"{version} · {lim.nodes} of {lim.node_cap} node(s) in remediation{label}"
        f" · {lim.actions_last_hour} of {lim.actions_cap} automatic action(s) this hour"
        f" · fleet of {lim.fleet_size}{state}"
    )


def _gpu(uuid: str) -> str:
    return uuid or "(node)"


def health_rows(h: admin_pb2.HealthInfo) -> list[tuple[str, tuple[str, ...]]]:
    """(row key, cells) for each sick GPU or node, queued and running episode, and GPU cordon."""
    rows: list[tuple[str, tuple[str, ...]]] = []
    for c in h.conditions:
        reason = c.reason if c.gpu_uuid else f"{c.type}: {c.reason}"
        act = f"{c.rule} → {c.action}" if c.rule else "no rule: shown only"
        rows.append(
            (
                f"sick:{c.node_id}:{c.gpu_uuid}:{c.type}",
                (
                    "sick",
                    c.node_id,
                    _gpu(c.gpu_uuid),
                    reason,
                    act,
                    c.episode_id or "-",
                    format_time_ms(c.since_ms),
                    c.message or "-",
                ),
            )
        )
    for title, episodes in (("queue", h.queue), ("running", h.running)):
        for e in episodes:
            job = f"{e.dag_id} {e.job_state}".strip() or "-"
            since = format_time_ms(e.started_at_ms or e.opened_at_ms)
            state = e.state if title == "queue" else f"{e.state} ({e.stage})"
            rows.append(
                (
                    f"{title}:{e.id}",
                    (
                        title,
                        e.node_id,
                        _gpu(e.gpu_uuid),
                        state,
                        f"{e.rule} → {e.action}",
                        job,
                        since,
                        e.wait_reason or "-",
                    ),
                )
            )
    for k in h.cordons:
        state = "quarantined" if k.quarantined else "cordoned"
        rows.append(
            (
                f"cordon:{k.node_id}:{k.gpu_uuid}",
                (
                    "cordon",
                    k.node_id,
                    _gpu(k.gpu_uuid),
                    state,
                    "-",
                    k.episode_id or "-",
                    format_time_ms(k.since_ms),
                    k.reason,
                ),
            )
        )
    return rows


class HealthScreen(BcScreen):
    AUTO_FOCUS = "#health"
    RELOAD_ON = ("health.", "node.condition", "job.")
    BINDINGS = [Binding("r", "refresh", "Refresh")]

    def __init__(self) -> None:
        super().__init__()
        self.info: admin_pb2.HealthInfo | None = None
        self.keys: list[str] = []

    def body(self) -> ComposeResult:
        yield Shown(id="health-limits")
        yield SafeTable(id="health", cursor_type="row")

    def on_mount(self) -> None:
        super().on_mount()
        t = self.query_one("#health", SafeTable)
        t.add_columns(*HEALTH_COLUMNS)
        t.focus()

    async def reload(self) -> None:
        src = self.bc.feed.source
        if src is None:
            return
        try:
            info = await src.get_health()
        except BcError as e:
            self.tell(fmt.text(f"health: {e.message}"), severity="error")
            return
        self.info = info
        rows = health_rows(info)
        self.keys = [k for k, _ in rows]
        t = self.query_one("#health", SafeTable)
        width = t.size.width or self.app.size.width  # the GPU, state, rule and why share the room left
        columns.refill(t, columns.sized(width, HEALTH_COLUMNS, [r for _, r in rows], (2, 3, 4, 7)), self.keys)
        self.query_one("#health-limits", Shown).show(fmt.text(limits_text(info)))

    def action_refresh(self) -> None:
        self.spawn(self.reload, "reload")
