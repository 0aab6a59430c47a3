"""`bc jobs`: multi-step fleet operations as DAGs (docs/jobs.md).

    bc jobs run remediate NODE [--gpus GPU-…,GPU-…] [--reason TEXT] [--deadline 30m]
    bc jobs run reboot NODE... [--max-parallel N] [--reason TEXT] [--deadline 30m]
    bc jobs run rollout --section S --file F.json --nodes n1,n2,… [--max-unavailable N] [--reason TEXT]
    bc jobs run drain NODE [--deadline 30m]      bc jobs run cordon NODE      bc jobs run uncordon NODE
    bc jobs list [--all] [--json]     bc jobs show DAG [--json]     bc jobs cancel DAG [--json]
    bc jobs slots [--set reboots=2 ...] [--json]

`bc jobs run` submits the DAG, then shows a progress line (`bc.cli.job_progress`) on stderr at most
once a second until the DAG is terminal, and prints its last line (or with `--json` the DAG document)
on stdout. It exits 0 when the DAG ended done, else 8 (`JobFailed`) with the reason, like
`bc cmd run --wait`. `--no-wait` prints the DAG id (or the document) and returns at once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import click

from bc.cli.admin_cmds import read_json_object
from bc.cli.connect import run_client, slow
from bc.cli.emit import emit
from bc.cli.job_progress import (
    JobFailed,
    awaiting_text,
    check_done,
    follow,
    glyph,
    job_to_json,
    progress_line,
    subjects_text,
    waits_text,
)
from bc.cli.output import Lines, echo, lines, paragraphs
from bc.cli.render import (
    cell,
    format_time_ms,
    parse_duration,
    render_fields,
    render_table,
)
from bc.client.admin import AdminClient
from bc.errors import Unavailable, UsageError
from bc.jobs.views import TEMPLATES
from bc.protocol.pb import admin_pb2
from bc.protocol.sections import SECTIONS

_T = TypeVar("_T")

MAX_PARALLEL = 10_000
MAX_SLOTS = 10_000

json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")


def _progress(line: str) -> None:
    echo(line, err=True)


async def submit_and_follow(
    client: AdminClient, request: admin_pb2.SubmitJobRequest, *, wait: bool = True
) -> admin_pb2.JobInfo:
    """Submit the DAG; with `wait`, follow it to its end with progress lines on stderr."""
    job = await slow(client, client.submit_job(request))
    if not wait or job.terminal:
        return job
    echo(f"job {job.id}: {job.template} submitted; `bc jobs show {job.id}` for its nodes", err=True)
    try:
        return await follow(client, job, _progress)
    except Unavailable as e:
        raise Unavailable(f"{e.message}; job {job.id} goes on without this watch: `bc jobs show {job.id}`") from e


# -- bc jobs run TEMPLATE ------------------------------------------------------------------------


class _Templates(click.Group):
    """`bc jobs run` with a template name that is no template says so in our words."""

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        name = args[0] if args else ""
        if name and not name.startswith("-") and self.get_command(ctx, name) is None:
            raise click.UsageError(f"there is no job template {name!r}; the templates are {', '.join(TEMPLATES)}")
        return super().resolve_command(ctx, args)


@click.group("jobs")
def jobs() -> None:
    """Multi-step operations (remediate, reboot, rollout, drain, cordon) as DAGs: run, list, show, cancel."""


@jobs.group("run", cls=_Templates)
def run() -> None:
    """Submit a job from a template and follow it until it ends (`--no-wait`: return at once)."""


def _run_options(fn: Callable[..., None]) -> Callable[..., None]:
    fn = click.option("--no-wait", is_flag=True, help="Print the DAG id and return; do not follow it.")(fn)
    fn = json_option(fn)
    return click.option("--reason", default="", help="Why (kept with the DAG and shown by `bc jobs show`).")(fn)


_deadline_option = click.option(
    "--deadline", default="30m", show_default=True, help="How long the drain may wait for the node's holds to end."
)


def _run(request: admin_pb2.SubmitJobRequest, *, no_wait: bool, as_json: bool) -> None:
    job = run_client(lambda c: submit_and_follow(c, request, wait=not no_wait))
    emit(as_json, lambda: job_to_json(job), job.id if no_wait else f"{job.id}  {progress_line(job)}")
    if not no_wait:
        check_done(job)


def _csv(value: str, what: str) -> list[str]:
    items = [v.strip() for v in value.split(",")]
    if not value.strip() or any(not v for v in items):
        raise UsageError(f"{what} must be a comma-separated list with no empty names, not {value!r}")
    return items


@run.command("remediate")
@click.argument("node_id", metavar="NODE")
@click.option("--gpus", default="", metavar="GPU-…,GPU-…", help="The GPUs to reset (default: every GPU).")
@_deadline_option
@_run_options
def run_remediate(node_id: str, gpus: str, deadline: str, reason: str, no_wait: bool, as_json: bool) -> None:
    """Cordon → drain → gpu.reset batch (quorum) → diag.nvml → uncordon NODE."""
    request = admin_pb2.SubmitJobRequest(
        template="remediate",
        nodes=[node_id],
        gpus=_csv(gpus, "--gpus") if gpus else [],
        reason=reason,
        deadline_s=parse_duration(deadline, what="--deadline"),
    )
    _run(request, no_wait=no_wait, as_json=as_json)


@run.command("reboot")
@click.argument("node_ids", metavar="NODE...", nargs=-1, required=True)
@click.option(
    "--max-parallel",
    type=click.IntRange(min=1, max=MAX_PARALLEL),
    default=None,
    help="At most this many nodes rebooting at once (default: the `reboots` pool alone).",
)
@_deadline_option
@_run_options
def run_reboot(
    node_ids: tuple[str, ...], max_parallel: int | None, deadline: str, reason: str, no_wait: bool, as_json: bool
) -> None:
    """Reboot the NODEs, a subgraph each (cordon, drain, reboot, reconcile), within the `reboots` pool."""
    request = admin_pb2.SubmitJobRequest(
        template="reboot", nodes=list(node_ids), reason=reason, deadline_s=parse_duration(deadline, what="--deadline")
    )
    if max_parallel is not None:
        request.max_parallel = max_parallel
    _run(request, no_wait=no_wait, as_json=as_json)


@run.command("rollout")
@click.option("--section", type=click.Choice(SECTIONS), required=True, help="The spec section to set.")
@click.option("--file", "path", required=True, metavar="FILE", help="The section as protobuf JSON (`-`: stdin).")
@click.option("--nodes", "nodes_csv", required=True, metavar="n1,n2,…", help="The nodes, in rollout order.")
@click.option(
    "--max-unavailable",
    type=click.IntRange(min=1, max=MAX_PARALLEL),
    default=None,
    help="Nodes patched at once (default 1).",
)
@_run_options
def run_rollout(
    section: str, path: str, nodes_csv: str, max_unavailable: int | None, reason: str, no_wait: bool, as_json: bool
) -> None:
    """Set SECTION on each node in turn and await its observed generation; stop at the first failure."""
    request = admin_pb2.SubmitJobRequest(
        template="rollout",
        nodes=_csv(nodes_csv, "--nodes"),
        section=section,
        section_json=read_json_object(f"the {section} section", "@" + path),
        reason=reason,
    )
    if max_unavailable is not None:
        request.max_unavailable = max_unavailable
    _run(request, no_wait=no_wait, as_json=as_json)


@run.command("drain")
@click.argument("node_id", metavar="NODE")
@_deadline_option
@_run_options
def run_drain(node_id: str, deadline: str, reason: str, no_wait: bool, as_json: bool) -> None:
    """Wait until NODE's holds end; fail at the deadline naming the holds left."""
    request = admin_pb2.SubmitJobRequest(
        template="drain", nodes=[node_id], reason=reason, deadline_s=parse_duration(deadline, what="--deadline")
    )
    _run(request, no_wait=no_wait, as_json=as_json)


@run.command("cordon")
@click.argument("node_id", metavar="NODE")
@_run_options
def run_cordon(node_id: str, reason: str, no_wait: bool, as_json: bool) -> None:
    """Cordon NODE (no new reservations), in turn with the other jobs on it."""
    request = admin_pb2.SubmitJobRequest(template="cordon", nodes=[node_id], reason=reason)
    _run(request, no_wait=no_wait, as_json=as_json)


@run.command("uncordon")
@click.argument("node_id", metavar="NODE")
@_run_options
def run_uncordon(node_id: str, reason: str, no_wait: bool, as_json: bool) -> None:
    """Uncordon NODE, in turn with the other jobs on it."""
    request = admin_pb2.SubmitJobRequest(template="uncordon", nodes=[node_id], reason=reason)
    _run(request, no_wait=no_wait, as_json=as_json)


# -- list, show, cancel ---------------------------------------------------------------------------


def _done_count(job: admin_pb2.JobInfo) -> str:
    return f"{sum(1 for n in job.nodes if n.state == 'done')}/{len(job.nodes)}"


@jobs.command("list")
@click.option("--all", "include_all", is_flag=True, help="Every DAG (default: live ones, 5 newest ended per template).")
@json_option
def jobs_list(include_all: bool, as_json: bool) -> None:
    """DAGs, oldest first."""
    resp = run_client(lambda c: slow(c, c.list_jobs(include_all=include_all)))
    if resp.omitted:
        echo(f"{resp.omitted} older job(s) left out to keep the reply under the frame limit", err=True)
    jobs = list(resp.jobs)
    emit(as_json, lambda: [job_to_json(j) for j in jobs], lambda: render_jobs(jobs), empty="no jobs")


def render_jobs(jobs: list[admin_pb2.JobInfo]) -> Lines:
    rows = [
        (
            j.id,
            j.template,
            f"{glyph(j.state)} {j.state}",
            subjects_text(list(j.subjects)),
            _done_count(j),
            j.requested_by,
            format_time_ms(j.created_at_ms),
            cell(j.first_error, width=80),
        )
        for j in jobs
    ]
    headers = ("ID", "TEMPLATE", "STATE", "SUBJECTS", "DONE", "BY", "CREATED", "ERROR")
    return render_table(headers, rows)


def _deps(n: admin_pb2.JobNodeInfo) -> str:
    return ",".join(d.node if d.when != "after_any" else f"{d.node}(any)" for d in n.deps)


def _detail(n: admin_pb2.JobNodeInfo) -> str:
    if n.error:
        return n.error
    doc = job_to_json(admin_pb2.JobInfo(nodes=[n]))["nodes"][0]["detail"]
    waits = waits_text(doc) if n.state == "running" else ""
    if isinstance(doc, dict):
        rest = " ".join(f"{k}={v}" for k, v in doc.items() if k not in ("waiting_for", "waiting_more"))
        return " ".join(part for part in (waits, rest) if part)
    return str(doc)


def render_job(job: admin_pb2.JobInfo) -> Lines:
    fields: list[tuple[str, object]] = [
        ("id", job.id),
        ("template", job.template),
        ("state", f"{glyph(job.state)} {job.state}" + (", cancel requested" if job.cancel_requested else "")),
        ("subjects", ", ".join(job.subjects)),
        ("requested by", job.requested_by),
        ("reason", job.reason),
        ("created", format_time_ms(job.created_at_ms) if job.created_at_ms else ""),
        ("settled", format_time_ms(job.settled_at_ms) if job.settled_at_ms else ""),
        ("first error", job.first_error),
        ("args", job.args_json if job.args_json != "{}" else ""),
    ]
    rows = [(n.id, n.kind, n.subject, f"{glyph(n.state)} {n.state}", _deps(n), _detail(n)) for n in job.nodes]
    table = render_table(("NODE", "KIND", "SUBJECT", "STATE", "DEPS", "ERROR/DETAIL"), rows)
    waiting = [awaiting_text(admin_pb2.JobInfo(awaiting_approval=[a])) for a in job.awaiting_approval]
    return paragraphs(lines(render_fields(fields), waiting), table)


@jobs.command("show")
@click.argument("dag_id", metavar="DAG")
@json_option
def jobs_show(dag_id: str, as_json: bool) -> None:
    """One DAG: its state and a table of its nodes (kind, subject, state, deps, error or detail)."""
    job = run_client(lambda c: slow(c, c.get_job(dag_id)))
    emit(as_json, lambda: job_to_json(job), lambda: render_job(job))


@jobs.command("cancel")
@click.argument("dag_id", metavar="DAG")
@json_option
def jobs_cancel(dag_id: str, as_json: bool) -> None:
    """Cancel a DAG's queued nodes and ask its running commands to stop; its tails still run."""
    resp = run_client(lambda c: slow(c, c.cancel_job(dag_id)))
    emit(
        as_json,
        lambda: {"cancelled": resp.cancelled, "job": job_to_json(resp.job)},
        f"job {dag_id}: cancelled; what already runs reports its real outcome (now {resp.job.state})"
        if resp.cancelled
        else f"job {dag_id}: nothing to cancel (it is {resp.job.state})",
    )


# -- slots ------------------------------------------------------------------------------------------


def parse_slot(text: str) -> tuple[str, int]:
    """`reboots=2` to ("reboots", 2); a capacity from 1 to 10,000."""
    name, sep, value = text.partition("=")
    if not sep or not name.strip() or not value.strip().isdigit():
        raise UsageError(f"--set takes POOL=CAPACITY (like reboots=2), not {text!r}")
    capacity = int(value.strip())
    if not 1 <= capacity <= MAX_SLOTS:
        raise UsageError(f"the capacity of {name.strip()} must be between 1 and {MAX_SLOTS:,}, not {capacity:,}")
    return name.strip(), capacity


@jobs.command("slots")
@click.option("--set", "settings", multiple=True, metavar="POOL=N", help="Set a pool's capacity (repeatable; admin).")
@json_option
def jobs_slots(settings: tuple[str, ...], as_json: bool) -> None:
    """The slot pools (how many nodes may reboot, roll out, be remediated at once) and what is held."""
    capacities: dict[str, int] = {}
    for text in settings:
        name, capacity = parse_slot(text)
        if name in capacities:
            raise UsageError(f"--set names the pool {name} twice")
        capacities[name] = capacity

    async def go(c: AdminClient) -> list[admin_pb2.JobPool]:
        if capacities:
            return list((await slow(c, c.job_slots(capacities))).pools)
        return list((await slow(c, c.list_jobs())).pools)  # a viewer reads the pools with the jobs

    pools = run_client(go)
    emit(
        as_json,
        pools,
        lambda: render_table(("POOL", "CAPACITY", "HELD"), [(p.name, p.capacity, p.held) for p in pools]),
    )


COMMANDS: tuple[click.Command, ...] = (jobs,)

__all__ = ["COMMANDS", "JobFailed", "jobs", "parse_slot", "render_job", "submit_and_follow"]
