"""`bc health`: what the health reconciler sees and does; `bc health policy show|set` (docs/health.md).

    bc health [--json]                                           conditions, queue, running, cordons, limits
    bc health policy show [--json]                               the policy in force and its versions
    bc health policy set POLICY|@FILE|@- [--reason TEXT] [--json]   a new version (admin)
    bc health gpu cordon NODE GPU --reason TEXT [--json]          keep new holds off a GPU (operator)
    bc health gpu return NODE GPU [--reason TEXT] [--json]        a quarantined or cordoned GPU back (operator)

Every string a node reported (a condition's reason and message) or an operator wrote (a policy's reason)
leaves through `bc.cli.output`'s escaping writer, like every other table.
"""

from __future__ import annotations

import json

import click

from bc.cli.admin_cmds import read_json_object
from bc.cli.connect import run_client, slow
from bc.cli.emit import emit
from bc.cli.output import Lines, lines, paragraphs
from bc.cli.render import format_time_ms, render_fields, render_table
from bc.client.admin import AdminClient
from bc.protocol.pb import admin_pb2

json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")


def _limits(h: admin_pb2.HealthInfo) -> str:
    lim = h.limits
    label = f", one per {lim.per_label}" if lim.per_label else ""
    state = "" if h.enabled else " (the policy is disabled: nothing new starts)"
    version = f"policy v{h.policy_version}" if h.policy_version else "the default policy"
    return (
        f"{version}: {lim.nodes} of {lim.node_cap} node(s) in remediation{label};"
        f" {lim.actions_last_hour} of {lim.actions_cap} automatic action(s) in the last hour;"
        f" fleet of {lim.fleet_size}{state}"
    )


def health_text(h: admin_pb2.HealthInfo) -> Lines:
    conditions = render_table(
        ("NODE", "GPU", "REASON", "SINCE", "RULE", "ACTION", "EPISODE"),
        [
            (
                c.node_id,
                c.gpu_uuid or "(node)",
                c.reason if c.gpu_uuid else f"{c.type}: {c.reason}",
                format_time_ms(c.since_ms),
                c.rule,
                c.action,
                c.episode_id,
            )
            for c in h.conditions
        ],
    )
    queue = render_table(
        ("EPISODE", "NODE", "GPU", "RULE", "ACTION", "WAITS FOR"),
        [(e.id, e.node_id, e.gpu_uuid or "(node)", e.rule, e.action, e.wait_reason) for e in h.queue],
    )
    running = render_table(
        ("EPISODE", "NODE", "GPU", "STAGE", "JOB", "JOB STATE", "STARTED", "WAITS FOR"),
        [
            (
                e.id,
                e.node_id,
                e.gpu_uuid or "(node)",
                e.stage,
                e.dag_id,
                e.job_state,
                format_time_ms(e.started_at_ms),
                e.wait_reason,
            )
            for e in h.running
        ],
    )
    cordons = render_table(
        ("NODE", "GPU", "STATE", "SINCE", "REASON"),
        [
            (
                c.node_id,
                c.gpu_uuid,
                "quarantined" if c.quarantined else "cordoned",
                format_time_ms(c.since_ms),
                c.reason,
            )
            for c in h.cordons
        ],
    )
    recent = render_table(
        ("EPISODE", "NODE", "GPU", "STATE", "ENDED", "OUTCOME"),
        [
            (e.id, e.node_id, e.gpu_uuid or "(node)", e.state, format_time_ms(e.ended_at_ms), e.outcome)
            for e in h.recent
        ],
    )
    return paragraphs(
        _limits(h),
        lines("sick GPUs and nodes:", conditions) if h.conditions else "sick GPUs and nodes: none",
        lines("queue:", queue) if h.queue else "queue: empty",
        lines("running:", running) if h.running else "running: none",
        lines("GPU cordons:", cordons) if h.cordons else "",
        lines("ended in the last 24 h:", recent) if h.recent else "",
    )


@click.group("health", invoke_without_command=True)
@json_option
@click.pass_context
def health(ctx: click.Context, as_json: bool) -> None:
    """The fleet's sick GPUs and what the health reconciler does about them (docs/health.md)."""
    if ctx.invoked_subcommand is not None:
        return

    async def go(c: AdminClient) -> admin_pb2.HealthInfo:
        return await c.get_health()

    info = run_client(go)
    emit(as_json, info, lambda: health_text(info))


@health.group("policy")
def policy() -> None:
    """The health policy: rules, drain, limits (show: a viewer; set: an admin)."""


def policy_text(p: admin_pb2.HealthPolicyInfo) -> Lines:
    doc = json.loads(p.policy_json or "{}")
    head = render_fields(
        [
            ("version", p.version or "0 (the defaults: never set)"),
            ("set by", p.set_by or "-"),
            ("set at", format_time_ms(p.set_at_ms) if p.set_at_ms else "-"),
            ("reason", p.reason or "-"),
        ]
    )
    rules = render_table(
        ("MATCH", "AT LEAST", "ACTION"),
        [(r.get("match", ""), r.get("at_least", 1), r.get("action", "")) for r in doc.get("rules", [])],
    )
    limits = doc.get("limits", {})
    settings = render_fields(
        [
            ("enabled", doc.get("enabled")),
            ("drain", f"{doc.get('drain')} (deadline {doc.get('drain_deadline_s')} s)"),
            ("on reset failure", doc.get("on_reset_failure")),
            ("repeat window", f"{doc.get('repeat_window_s')} s: sick again within it is quarantined"),
            ("flap window", f"{doc.get('flap_window_s')} s"),
            ("max nodes", f"{limits.get('max_nodes')} and {limits.get('max_fleet_percent')} % of the fleet"),
            ("per label", limits.get("per_label") or "-"),
            ("actions per hour", limits.get("max_actions_per_hour")),
        ]
    )
    history = render_table(
        ("VERSION", "SET BY", "SET AT", "REASON"),
        [(v.version, v.set_by, format_time_ms(v.set_at_ms), v.reason) for v in p.history],
    )
    return paragraphs(
        head,
        settings,
        lines("rules (the first that matches acts):", rules),
        preapprovals_text(p),
        history if p.history else "",
    )


PREAPPROVAL_STATES = {
    "none": "",
    "no-approvers": "not signed: no approvers existed when this version was set (none is needed while there are none)",
    "pending": "waiting for the approvers: {a} of {k} signed batch {b} (bc approve sign {b}); nothing is pre-approved",
    "approved": "in force: {a} of {k} approvers signed batch {b}",
    "rejected": "rejected (batch {b}): nothing is pre-approved",
    "withdrawn": "withdrawn (batch {b}): nothing is pre-approved",
    "expired": "expired (batch {b}: fewer than {k} signatures count now): nothing is pre-approved",
}


def preapprovals_text(p: admin_pb2.HealthPolicyInfo) -> Lines | str:
    if not p.preapprovals:
        return ""
    template = PREAPPROVAL_STATES.get(p.preapproval_state, "{s} (batch {b})")
    a, k = p.preapproval_approvals, p.preapproval_threshold
    head = template.format(a=a, k=k, b=p.preapproval_batch, s=p.preapproval_state)
    rows = [
        (e.kind, ",".join(f"{k}={v}" for k, v in sorted(e.pool.items())), format_time_ms(e.expires_at_ms), e.state)
        for e in p.preapprovals
    ]
    return lines(f"pre-approvals: {head}", render_table(("KIND", "POOL", "EXPIRES", "STATE"), rows))


def _policy_doc(p: admin_pb2.HealthPolicyInfo) -> dict[str, object]:
    return {
        "version": p.version,
        "policy": json.loads(p.policy_json or "{}"),
        "set_by": p.set_by,
        "set_at_ms": p.set_at_ms,
        "reason": p.reason,
        "history": [
            {"version": v.version, "set_by": v.set_by, "set_at_ms": v.set_at_ms, "reason": v.reason} for v in p.history
        ],
        "preapproval": {
            "state": p.preapproval_state,
            "batch_id": p.preapproval_batch,
            "approvals": p.preapproval_approvals,
            "threshold": p.preapproval_threshold,
            "entries": [
                {
                    "kind": e.kind,
                    "pool": dict(sorted(e.pool.items())),
                    "expires_at_ms": e.expires_at_ms,
                    "state": e.state,
                }
                for e in p.preapprovals
            ],
        },
    }


@policy.command("show")
@json_option
def policy_show(as_json: bool) -> None:
    """The policy in force and its latest versions."""

    async def go(c: AdminClient) -> admin_pb2.HealthPolicyInfo:
        return await c.get_health_policy()

    info = run_client(go)
    emit(as_json, lambda: _policy_doc(info), lambda: policy_text(info))


@policy.command("set")
@click.argument("policy_json", metavar="POLICY|@FILE|@-")
@click.option("--reason", default="", help="Why (kept with the version).")
@json_option
def policy_set(policy_json: str, reason: str, as_json: bool) -> None:
    """Store a new version of the policy (admin); a missing key takes its default."""
    text = read_json_object("the health policy", policy_json)

    async def go(c: AdminClient) -> admin_pb2.HealthPolicyInfo:
        return await slow(c, c.set_health_policy(text, reason))

    info = run_client(go)
    waiting = f": its pre-approvals wait for the approvers (bc approve sign {info.preapproval_batch})"
    said = f"health policy v{info.version} set" + (waiting if info.preapproval_state == "pending" else "")
    emit(as_json, lambda: _policy_doc(info), lambda: said)


@health.group("gpu")
def gpu() -> None:
    """One GPU out of placement and back: a person's cordon, and the return of a quarantined GPU (operator)."""


def _change_doc(c: admin_pb2.GpuCordonChange) -> dict[str, object]:
    return {
        "node_id": c.node_id,
        "gpu_uuid": c.gpu_uuid,
        "reason": c.cordon.reason,
        "quarantined": c.cordon.quarantined,
        "episode_id": c.cordon.episode_id,
        "still_sick": c.still_sick,
    }


@gpu.command("cordon")
@click.argument("node_id", metavar="NODE")
@click.argument("gpu_name", metavar="GPU")
@click.option("--reason", required=True, help="Why (kept with the cordon, shown in `bc health`).")
@json_option
def gpu_cordon(node_id: str, gpu_name: str, reason: str, as_json: bool) -> None:
    """Keep new holds off GPU (its UUID or index) of NODE until someone returns it; holds on it stay."""

    async def go(c: AdminClient) -> admin_pb2.GpuCordonChange:
        return await c.cordon_gpu(node_id, gpu_name, reason)

    info = run_client(go)
    emit(as_json, lambda: _change_doc(info), lambda: f"cordoned GPU {info.gpu_uuid} of {info.node_id}")


@gpu.command("return")
@click.argument("node_id", metavar="NODE")
@click.argument("gpu_name", metavar="GPU")
@click.option("--reason", default="", help="Why (kept in the health.gpu.returned event).")
@json_option
def gpu_return(node_id: str, gpu_name: str, reason: str, as_json: bool) -> None:
    """Return a quarantined or cordoned GPU (its UUID or index) of NODE to placement."""

    async def go(c: AdminClient) -> admin_pb2.GpuCordonChange:
        return await c.return_gpu(node_id, gpu_name, reason)

    info = run_client(go)

    def text() -> Lines:
        was = "quarantined" if info.cordon.quarantined else "cordoned"
        note = (
            f"note: it still reads {info.still_sick}: the health reconciler acts on it again under the policy"
            if info.still_sick
            else ""
        )
        return paragraphs(f"returned GPU {info.gpu_uuid} of {info.node_id} to placement (it was {was})", note)

    emit(as_json, lambda: _change_doc(info), text)


COMMANDS: tuple[click.Command, ...] = (health,)
