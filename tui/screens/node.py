"""Node: sections with reasons, conditions with ages, instances (its VMs), holds, recent commands and events.

`c` cordon, `u` uncordon, `r` run a command (kind picker, payload editor; the same RunCommand call as
`bc cmd run`), each confirmed first.
"""

from __future__ import annotations

import json
from functools import partial

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll

from bc.client.fmt import volume_storage_text
from bc.errors import BcError
from bc.protocol import kinds
from bc.protocol import usage_units as units
from bc.protocol.atoms import cdi_qualified
from bc.protocol.pb import admin_pb2, common_pb2
from tui import fmt
from tui.screens.base import BcScreen
from tui.shown import Shown
from tui.widgets import ConfirmScreen, RunCommandScreen


def render_node(
    info: admin_pb2.NodeInfo,
    holds: list[admin_pb2.Reservation],
    commands: list[admin_pb2.CommandInfo],
    events: list[admin_pb2.EventRecord],
    usage: list[admin_pb2.UsageRow] | None = None,
) -> fmt.Safe:
    lines = [
        f"{info.node_id}  role {info.role}  {info.state} for {fmt.age(info.state_age_ms)}"
        f"  last heard {fmt.age(info.last_seen_age_ms) if info.last_seen_age_ms >= 0 else 'never'}",
        f"generation {info.generation} · applied {info.applied_generation} · observed {info.observed_generation}"
        + ("  (observed lags)" if info.observed_generation < info.generation else ""),
        f"cordoned: {'yes' if info.cordoned else 'no'} · no-schedule: {', '.join(info.no_schedule) or 'none'}"
        + (f" · job hold {info.job_hold}" if info.job_hold else ""),
        f"labels: {', '.join(f'{k}={v}' for k, v in sorted(info.labels.items())) or 'none'}",
        "",
        "SECTIONS",
    ]
    for s in info.sections or []:
        state = common_pb2.SectionState.Name(s.state).lower()
        lines.append(f"  {s.section:<12} {state:<12} gen {s.generation}  {s.reason} {s.message}".rstrip())
    if not info.sections:
        lines.append("  n/a (no status reported)")
    lines.append("CONDITIONS")
    for c in info.conditions:
        lines.append(f"  {c.type:<20} {c.status:<8} {fmt.age(c.age_ms):>5}  {c.reason} {c.message}".rstrip())
    if not info.conditions:
        lines.append("  none reported")
    lines.append("INSTANCES")  # the node's last report: bc's VMs, and domains bc did not create (left alone)
    for i in info.instances:
        desired = f"want {i.desired.lower()}" if i.managed else "not bc's"
        size = f"{i.vcpus} vCPU {i.memory_mib} MiB" if i.vcpus else ""
        if i.gpus:  # passed through (VFIO): how many, the UUIDs are in `bc instances show`
            size += f" {len(i.gpus)} GPU{'s' * (len(i.gpus) != 1)}"
        lines.append(f"  {i.id:<20} {i.state.lower():<9} {desired:<14} {size}  {i.message}".rstrip())
    if not info.instances:
        lines.append("  none reported")
    if info.HasField("volume_storage"):
        lines.append(f"  {volume_storage_text(info.volume_storage)}")
    lines.append("CAPACITY")
    for cap in info.capacity:
        lines.append(f"  {cap.device_class:<10} booked {cap.booked_now}/{cap.offered} now, {cap.booked_later} later")
    lines.append("HOLDS")
    for r in holds:
        devices = ", ".join(cdi_qualified(d.atom_id or d.gpu_uuid) for d in r.devices) or "-"
        lines.append(f"  {r.id}  {r.state:<9} {r.gpus} {r.device_class or 'gpu'}  {devices}")
    if not holds:
        lines.append("  none")
    lines.append("USAGE")  # each class in its own unit: a MIG instance or a shared slot is not a GPU-hour
    for u in usage or []:
        lines.append(
            f"  {units.class_label(u.device_class, u.profile):<18} {units.amount(u.atom_ms, u.device_class, u.profile)}"
        )
    if not usage:
        lines.append("  none recorded" if usage is not None else "  n/a")
    lines.append("RECENT COMMANDS")
    for cmd in commands[:10]:
        lines.append(
            f"  {cmd.id}  {cmd.kind:<18} {cmd.state:<10} {fmt.age(cmd.updated_age_ms):>5}  {cmd.reason}".rstrip()
        )
    if not commands:
        lines.append("  none")
    lines.append("RECENT EVENTS")
    for ev in events[-10:]:
        lines.append(f"  {ev.seq:>7} {ev.type:<24} {ev.data_json}")
    if not events:
        lines.append("  none since the TUI started")
    return fmt.block(lines)  # every line escaped: a node's `\n` in a reason never starts a line of its own


class NodeScreen(BcScreen):
    AUTO_FOCUS = "VerticalScroll"
    RELOAD_ON = ("node.", "command.", "reservation.", "spec.", "security.")
    BINDINGS = [
        Binding("escape", "back", "Back"),
        Binding("c", "cordon(True)", "Cordon"),
        Binding("u", "cordon(False)", "Uncordon"),
        Binding("r", "run", "Run command"),
    ]

    def __init__(self, node_id: str) -> None:
        super().__init__()
        self.node_id = node_id

    def body(self) -> ComposeResult:
        with VerticalScroll():
            yield Shown(fmt.text(f"{self.node_id}: reading…"), id="node-detail")

    def on_mount(self) -> None:
        super().on_mount()
        self.spawn(self.reload, "reload")

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in ("cordon", "run"):
            return self.bc.role != "viewer"
        return True

    def feed_event(self, ev: admin_pb2.EventRecord) -> None:
        if ev.subject == self.node_id or self.node_id in ev.data_json:
            super().feed_event(ev)

    async def reload(self) -> None:
        src = self.bc.feed.source
        if src is None:
            return
        try:
            info = await src.get_node(self.node_id)
            holds = await src.list_reservations(node_id=self.node_id)
            cmds = await src.list_commands(node_id=self.node_id, limit=10)
            used = [u for u in (await src.usage(by="node")).rows if u.key == self.node_id]
        except BcError as e:
            self.tell(fmt.text(f"{self.node_id}: {e.message}"), severity="error")
            return
        evs = [e for e in self.bc.state.events if e.subject == self.node_id or self.node_id in e.data_json]
        self.query_one("#node-detail", Shown).show(render_node(info, holds, cmds, evs, used))

    def action_back(self) -> None:
        self.app.pop_screen()

    def action_cordon(self, cordon: bool) -> None:
        self.spawn(partial(self._cordon, cordon), "write")

    async def _cordon(self, cordon: bool) -> None:
        verb = "cordon" if cordon else "uncordon"
        what = "it takes no new holds; what runs keeps running" if cordon else "it takes new holds again"
        if not await self.app.push_screen_wait(ConfirmScreen(fmt.text(f"{verb} {self.node_id}?"), fmt.text(what))):
            return
        src = self.source()
        if src is not None and await self.call(verb, src.cordon_node(self.node_id, cordon)) is not None:
            self.tell(fmt.text(f"{self.node_id} {verb}ed"))
        await self.reload()

    def action_run(self) -> None:
        self.spawn(self._run, "write")

    async def _run(self) -> None:
        choices = [
            (f"{k.name} ({k.lane}{', destructive' if k.destructive else ''})", k.name) for k in kinds.KINDS.values()
        ]
        picked = await self.app.push_screen_wait(RunCommandScreen(self.node_id, choices))
        if picked is None:
            return
        kind, payload = picked
        try:
            json.loads(payload or "{}")
        except json.JSONDecodeError as e:
            self.tell(fmt.text(f"the payload is not JSON: {e}"), severity="error")
            return
        k = kinds.KINDS[kind]
        body = fmt.block(
            [
                f"{kind} on {self.node_id} (lane {k.lane}{', destructive' if k.destructive else ''})",
                f"payload {payload}",
            ]
        )
        if not await self.app.push_screen_wait(ConfirmScreen(fmt.text("Run this command?"), body)):
            return
        src = self.source()
        if src is None:
            return
        out = await self.call(f"run {kind}", src.run_command(self.node_id, kind, payload_json=payload))
        if isinstance(out, admin_pb2.CommandInfo):
            self.tell(fmt.text(f"queued {out.id} ({out.state})"))
        await self.reload()
