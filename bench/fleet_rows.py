"""Issue 38's figures that need no generated fleet, each beside its goal (`make bench-fleet` runs this after
`bench.fleet`; docs/scale.md "Every figure").

    python -m bench.fleet_rows [--only throughput,placement,nodes,tui,journal] [--url postgresql://…]
                               [--commands 2000] [--fleet-nodes 10000] [--json]

Each row runs the benchmark that owns it, in this process or its own subprocesses as that benchmark does:

* **throughput** (`bench.throughput`): server and agent CPU per command end to end on SQLite at 1 and 100
  nodes (one `bc serve`), and PostgreSQL at 100 nodes behind `--gateways` (3) `bc serve` processes against
  SQLite's one gateway at 100 in the same run. The issue's row names 1,000 nodes: the bench's agents are full
  production agents (an fsynced journal, health and telemetry loops each, about 2.5 ms of CPU a second
  idle), so 1,000 of them need more cores than this 2-core machine before a single command; `--pg-nodes`
  sets it where there are.
* **placement** (`bench.capacity.wired_pass`): 1,000 nodes × 10,000 pending through a real SQLite store, the
  first pass (placing thousands) and the next one after a single new reservation (what a steady fleet pays
  for each change; the goal is that one).
* **nodes** (`bench.nodes_list`): `bc nodes --json` as an operator runs it at `--fleet-nodes` (10,000).
* **tui** (`bench.tui`): one node's update applied to the TUI's table at `--fleet-nodes`, p99.
* **journal** (`bench.commands.journal_figures` on /dev/shm): the agent journal's accepted + done writes
  against raw fsynced commits on the same tmpfs, in the dispatcher's shapes.

Every row prints the machine's core count and load with it; a row below its goal says so (`MISSED`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.fleet_figures import parse_loadavg
from bench.pg_drivers import PG_URL

PARTS = ("throughput", "placement", "nodes", "tui", "journal")


@dataclass(frozen=True)
class Figure:
    """One row: what was measured, against what goal, and whether it is met."""

    row: str
    value: float
    unit: str
    goal: float
    at_most: bool  # the goal is an upper bound (times, CPU) or a lower one (ratios)
    command: str
    machine: str
    detail: str = ""

    @property
    def met(self) -> bool:
        return self.value <= self.goal if self.at_most else self.value >= self.goal

    def line(self) -> str:
        bound = "≤" if self.at_most else "≥"
        verdict = "met" if self.met else "MISSED"
        detail = f" ({self.detail})" if self.detail else ""
        return (
            f"{self.row}: {self.value:g} {self.unit}{detail}; goal {bound} {self.goal:g} {self.unit}: {verdict}"
            f" [{self.machine}] `{self.command}`"
        )


def machine() -> str:
    return parse_loadavg(Path("/proc/loadavg").read_text(), os.cpu_count() or 1).note().strip("[]")


def throughput_figures(results: Sequence[dict[str, Any]], command: str, note: str) -> list[Figure]:
    """The CPU-per-command rows and the PostgreSQL ratio from `bench.throughput`'s results."""
    out: list[Figure] = []
    by = {(r["store"], r["nodes"]): r for r in results}
    for r in results:
        if r["store"] != "sqlite":
            continue
        cpu = r["cpu_ms_per_command"]
        where = f"{r['nodes']} node{'s' if r['nodes'] != 1 else ''}, SQLite, one gateway"
        detail = f"{cpu['serve_net_of_idle']:g} net of idle; {r['commands_per_s']:g} commands/s"
        out.append(Figure(f"server CPU per command, {where}", cpu["serve"], "ms", 1.0, True, command, note, detail))
        detail = f"{cpu['agents_net_of_idle']:g} net of idle"
        out.append(Figure(f"agent CPU per command, {where}", cpu["agents"], "ms", 1.0, True, command, note, detail))
    for r in results:
        base = by.get(("sqlite", r["nodes"]))
        if r["store"] != "postgres" or base is None:
            continue
        ratio = round(r["commands_per_s"] / base["commands_per_s"], 2)
        detail = (
            f"{r['commands_per_s']:g} against {base['commands_per_s']:g} commands/s; server CPU"
            f" {r['cpu_ms_per_command']['serve']:g} ms a command over its {r['gateways']} processes"
        )
        row = f"PostgreSQL with {r['gateways']} gateways ÷ SQLite's one gateway, {r['nodes']} nodes"
        out.append(Figure(row, ratio, "×", 0.8, False, command, note, detail))
    return out


async def throughput(args: argparse.Namespace) -> list[Figure]:
    from bench import throughput as tp

    argv = [
        "--nodes",
        f"1,{args.pg_nodes}",
        "--commands",
        str(args.commands),
        "--store",
        "both",
        "--url",
        args.url,
        "--gateways",
        str(args.gateways),
    ]
    out = await tp.run(tp.parser().parse_args(argv))
    note = machine()
    return throughput_figures(out["results"], "python -m bench.throughput " + " ".join(argv), note)


async def placement(args: argparse.Namespace) -> list[Figure]:
    from bench.capacity import wired_pass

    f = await wired_pass(1000, 10_000, 1, False)
    note = machine()
    command = "python -m bench.capacity --part pass --wired-nodes 1000 --wired-pending 10000 --wired-repeats 1"
    first = f"first pass {f['pass_ms']['median']:g} ms: {f.get('placed', 0)} placed, {f.get('waiting', 0)} waiting"
    row = "placement pass after one new reservation, 1,000 nodes × 10,000 pending, SQLite"
    return [Figure(row, f["next_pass_after_one_new_ms"]["median"] / 1000, "s", 0.5, True, command, note, first)]


async def nodes(args: argparse.Namespace) -> list[Figure]:
    from bench.nodes_list import figures

    f = await figures(args.fleet_nodes, 5, None, False)
    note = machine()
    detail = f"CLI CPU {f['cli_cpu_s']:g} s, server CPU {f['server_cpu_s_per_call']:g} s a call, {f['bytes']:,} B"
    command = f"python -m bench.nodes_list --nodes {args.fleet_nodes} --runs 5"
    row = f"`bc nodes --json` at {args.fleet_nodes:,} nodes, SQLite, median of 5"
    return [Figure(row, f["wall_s"], "s", 0.5, True, command, note, detail)]


async def tui(args: argparse.Namespace) -> list[Figure]:
    from bench.tui import figures

    f = await figures(args.fleet_nodes)
    note = machine()
    detail = f"median {f['update_ms_median']:g} ms; start-up {f['startup_to_first_full_render_ms']:g} ms"
    row = f"TUI node table, one node's update at {args.fleet_nodes:,} nodes, p99"
    command = f"python -m bench.tui --nodes {args.fleet_nodes}"
    return [Figure(row, float(str(f["update_ms_p99"])), "ms", 16.0, True, command, note, detail)]


async def journal(args: argparse.Namespace) -> list[Figure]:
    from bench.commands import journal_figures

    before = tempfile.tempdir
    tempfile.tempdir = args.journal_dir
    try:
        f = await journal_figures()
    finally:
        tempfile.tempdir = before
    note = machine()
    command = f"TMPDIR={args.journal_dir} python -m bench.run --only journal"
    out = []
    for shape in ("one_at_a_time", "control_lane", "every_lane"):
        s = f[shape]
        detail = (
            f"{s['journal_writes_per_s']:,} writes/s against {f['raw_fsynced_commits_per_s']:,} raw commits/s,"
            f" {s['writes_per_commit']:g} writes a commit, range {s['ratio_range'][0]:g}–{s['ratio_range'][1]:g}"
        )
        row = f"journal accepted + done ÷ raw fsynced commits on {f['dir']}, {shape.replace('_', ' ')}"
        out.append(Figure(row, s["ratio"], "×", 0.5, False, command, note, detail))
    return out


RUNNERS: dict[str, Callable[[argparse.Namespace], Any]] = {
    "throughput": throughput,
    "placement": placement,
    "nodes": nodes,
    "tui": tui,
    "journal": journal,
}


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--only", default=",".join(PARTS), help=f"comma-separated, of {', '.join(PARTS)}")
    ap.add_argument("--url", default=PG_URL, help="the PostgreSQL database (a fresh schema per run)")
    ap.add_argument("--commands", type=int, default=2000, help="commands per throughput run (default 2000)")
    ap.add_argument("--gateways", type=int, default=3, help="bc serve processes on PostgreSQL (default 3)")
    ap.add_argument("--pg-nodes", type=int, default=100, help="nodes of the SQLite/PostgreSQL comparison (100)")
    ap.add_argument("--fleet-nodes", type=int, default=10_000, help="nodes of `bc nodes --json` and the TUI")
    ap.add_argument(
        "--journal-dir",
        # tmpfs: the fsync costs nothing, so what is left is the journal's own Python against SQLite's C loop.
        default="/dev/shm" if os.path.isdir("/dev/shm") else None,
        help="where the journal's files go (default /dev/shm)",
    )
    ap.add_argument("--json", action="store_true")
    return ap


async def run(args: argparse.Namespace) -> list[Figure]:
    parts = [p.strip() for p in args.only.split(",") if p.strip()]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        raise SystemExit(f"bench.fleet_rows: no part {', '.join(unknown)}; the parts are {', '.join(PARTS)}")
    figures: list[Figure] = []
    for part in parts:
        got = await RUNNERS[part](args)
        if not args.json:
            for f in got:
                print(f.line(), flush=True)
        figures += got
    return figures


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    figures = asyncio.run(run(args))
    if args.json:
        print(json.dumps([{**asdict(f), "met": f.met} for f in figures], indent=2))
    else:
        missed = sum(not f.met for f in figures)
        print(f"{len(figures)} figures on {os.cpu_count()} cores: {len(figures) - missed} met, {missed} missed")


if __name__ == "__main__":
    main()
