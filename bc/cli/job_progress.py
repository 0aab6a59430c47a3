"""What the CLI shows of a job: the one-line progress of a DAG, its JSON document, and the wait.

Shared by `bc jobs` (`bc.cli.job_cmds`) and `bc nodes cordon/uncordon` (`bc.cli.admin_cmds`), which
are one-node DAGs. Pure rendering except `follow`, which reads the server's `WatchJob` stream.

A progress line is the DAG's roll-up glyph, its template, its subjects and its node chain, each node
with its state's glyph: `▶ reboot n1,n2  n1.cordon✓ n1.drain▶ n2.cordon○ …`. Glyphs: ○ queued,
▶ running, ✓ done, ✗ failed, ⊘ cancelled. A chain too long for one line becomes counts and the
running nodes.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from bc.cli.render import format_time_ms, message_to_json
from bc.client.admin import AdminClient
from bc.client.reconnect import reopening
from bc.errors import BcError, ProtocolError
from bc.protocol.pb import admin_pb2
from bc.seams.clock import SystemClock

GLYPHS = {"queued": "○", "running": "▶", "done": "✓", "failed": "✗", "cancelled": "⊘"}
STATE_ORDER = ("done", "running", "queued", "failed", "cancelled")

CHAIN_WIDTH = 100
"""Past this many characters the node chain is summarized: counts per state and the running nodes."""

SUBJECTS_SHOWN = 6
"""Subjects named in a progress line; the rest are counted."""

PROGRESS_EVERY_S = 1.0
"""At most one progress line a second (and always the terminal one)."""


class JobFailed(BcError):
    """A waited-for job ended failed or cancelled: exit 8, as `bc cmd run --wait` for a command."""

    exit_code = 8


def glyph(state: str) -> str:
    return GLYPHS.get(state, "?")


def subjects_text(subjects: list[str]) -> str:
    if not subjects:
        return "-"
    shown = ",".join(subjects[:SUBJECTS_SHOWN])
    rest = len(subjects) - SUBJECTS_SHOWN
    return shown + (f",…(+{rest})" if rest > 0 else "")


def _chain(nodes: list[admin_pb2.JobNodeInfo]) -> str:
    chain = " ".join(f"{n.id}{glyph(n.state)}" for n in nodes)
    if len(chain) <= CHAIN_WIDTH:
        return chain
    counts = {s: sum(1 for n in nodes if n.state == s) for s in STATE_ORDER}
    parts = [f"{counts[s]}{glyph(s)}" for s in STATE_ORDER if counts[s]]
    running = [n.id for n in nodes if n.state == "running"]
    summary = f"{len(nodes)} nodes: " + " ".join(parts)
    if running:
        names = ", ".join(running[:4]) + (f", …(+{len(running) - 4})" if len(running) > 4 else "")
        summary += f"; running {names}"
    return summary


def awaiting_text(job: admin_pb2.JobInfo) -> str:
    """What the job waits for from its approvers: `awaiting approval: batch B, 1 of 2 signed` ("" for nothing)."""
    return "; ".join(
        f"awaiting approval: batch {a.batch_id}, {a.signed} of {a.needed} signed" for a in job.awaiting_approval
    )


def progress_line(job: admin_pb2.JobInfo) -> str:
    """One line: the roll-up glyph, template, subjects and node chain (and the reason once it failed), then
    what each running node waits for (a drain: the reservations it waits out)."""
    line = f"{glyph(job.state)} {job.template} {subjects_text(list(job.subjects))}  {_chain(list(job.nodes))}"
    if not job.terminal and job.awaiting_approval:
        line += f"  ({awaiting_text(job)})"
    if job.terminal and job.state != "done":
        line += f"  ({job.state}: {failure_reason(job)})"
    for n in job.nodes:
        waits = waits_text(_object(n.detail_json)) if n.state == "running" else ""
        if waits:
            line += f"; {n.id} {waits}"
    return line


def waits_text(detail: Any) -> str:
    """`waits for r-1 (tenant acme, ends 2026-12-05T10:00:00Z), r-2 (no tenant, open-ended) and 3 more`:
    a waiting drain's `waiting_for` detail; empty for any other detail."""
    if not isinstance(detail, dict) or not isinstance(detail.get("waiting_for"), list):
        return ""
    parts = []
    for r in detail["waiting_for"]:
        if not isinstance(r, dict):
            continue
        tenant = f"tenant {r['tenant']}" if r.get("tenant") else "no tenant"
        end = r.get("end_ms")
        ends = f"ends {format_time_ms(int(end))}" if isinstance(end, int) else "open-ended"
        parts.append(f"{r.get('id', '?')} ({tenant}, {ends})")
    if not parts:
        return ""
    more = detail.get("waiting_more")
    return "waits for " + ", ".join(parts) + (f" and {more} more" if isinstance(more, int) and more else "")


def failure_reason(job: admin_pb2.JobInfo) -> str:
    """Why a job did not end done: its first error, else its first failed node's, else how it ended."""
    if job.first_error:
        return job.first_error
    for n in job.nodes:
        if n.state == "failed" and n.error:
            return f"{n.id}: {n.error}"
    if job.state == "cancelled" or job.cancel_requested:
        return "cancelled"
    return "no reason given"


def check_done(job: admin_pb2.JobInfo) -> None:
    """Raise `JobFailed` (exit 8) with the reason unless the job ended done."""
    if job.state != "done":
        subjects = subjects_text(list(job.subjects))
        raise JobFailed(f"job {job.id} ({job.template} {subjects}) {job.state}: {failure_reason(job)}")


def _object(text: str) -> Any:
    if not text:
        return {}
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text  # show what the server sent rather than fail on it


def job_to_json(job: admin_pb2.JobInfo) -> dict[str, Any]:
    """The DAG document (docs/jobs.md "CLI"): the proto fields in order, `args` and each `detail` parsed."""
    doc: dict[str, Any] = {}
    for key, value in message_to_json(job).items():
        if key == "args_json":
            doc["args"] = _object(job.args_json)
        elif key == "nodes":
            doc["nodes"] = [_node_json(raw) for raw in value]
        else:
            doc[key] = value
    return doc


def _node_json(raw: dict[str, Any]) -> dict[str, Any]:
    return {("detail" if k == "detail_json" else k): (_object(v) if k == "detail_json" else v) for k, v in raw.items()}


async def _next(stream: AsyncIterator[admin_pb2.JobInfo]) -> admin_pb2.JobInfo | None:
    try:
        return await anext(stream)
    except StopAsyncIteration:
        return None


async def follow(client: AdminClient, job: admin_pb2.JobInfo, show: Callable[[str], None]) -> admin_pb2.JobInfo:
    """Watch `job` until it is terminal, calling `show` with a progress line at most once a second."""
    if job.terminal:
        return job
    loop = asyncio.get_running_loop()
    # Each message is the whole DAG: after a `bc serve` restart the watch is opened again and goes on.
    stream = reopening(lambda: client.watch_job(job.id), client.server_info, SystemClock(), show, client.server)
    shown, shown_at = "", float("-inf")
    pending = asyncio.ensure_future(_next(stream))
    try:
        while True:
            line = progress_line(job)
            if line != shown and (job.terminal or loop.time() - shown_at >= PROGRESS_EVERY_S):
                show(line)
                shown, shown_at = line, loop.time()
            if job.terminal:
                return job
            wait = None if line == shown else max(0.0, shown_at + PROGRESS_EVERY_S - loop.time())
            done, _ = await asyncio.wait({pending}, timeout=wait)
            if pending in done:
                nxt = pending.result()
                if nxt is None:
                    raise ProtocolError(f"the server ended the watch of job {job.id} before it settled")
                job = nxt
                pending = asyncio.ensure_future(_next(stream))
    finally:
        pending.cancel()
        await asyncio.gather(pending, return_exceptions=True)  # retrieves its outcome, whatever it was
        await stream.aclose()
