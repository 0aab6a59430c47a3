"""`bc sim`: the production control plane, gateway and agents on virtual time, under seeded chaos.

    bc sim --nodes N --chaos none|light|heavy|storm --seed S [--duration 2h] [--gateways 1..8] [--journal-files]
           [--health] [--instances] [--trace run.jsonl] [--json] [--break RULE]
    bc sim ... --seeds 1-50 [--parallel N]      (a sweep: bc.sim.sweep)

The run (`bc.sim.fleet.run_sync`) gets the workload of `bc.sim.workload`, seeded from `--seed`. While it
runs, a progress line (simulated time, events, faults so far) goes to stderr about once a wall second,
so stdout holds only the summary (`bc.sim.report`) or, with `--json`, one JSON document. Exit 0 when
every invariant holds, `InvariantFailed` (exit 10) when one fails, `HarnessFailed` (exit 11) when the
simulator itself failed (a fault it could not inject: a bug in bc sim, said with the seed that replays it,
never a traceback); bad input is one sentence and exit 2 before anything runs. Same seed, same digest: the
line `reproduce:` is the command that replays it.

With `--seeds` it sweeps: each seed in a forked process (`--parallel`, the host's cores by default), a line
per seed as it ends, then a summary and the command that replays each seed to look at. Exit 10 when a seed
broke an invariant or the harness, or, with `--break`, when a seed missed the bug.

The progress line is paced by a ticker thread that sleeps one wall second at a time and raises a flag;
the run never reads it (only whether to print), so pacing cannot change what the simulation does.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import random
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import click

from bc.cli.output import echo, json_lines, lines, text_lines
from bc.cli.render import format_duration, parse_duration
from bc.errors import BcError, UsageError
from bc.protocol.text_safety import one_line

if TYPE_CHECKING:
    from bc.sim.sweep import SeedOutcome

MAX_NODES = 100_000
MAX_GATEWAYS = 8
DEFAULT_DURATION = "1h"


class InvariantFailed(BcError):
    """A simulated run broke a fleet invariant; the summary (or the JSON) says which and how to replay it."""

    exit_code = 10


class HarnessFailed(BcError):
    """The simulator itself failed (a fault it could not inject): a bug in bc sim, not a verdict on the fleet."""

    exit_code = 11


def workload_seed(seed: int) -> str:
    """The workload's own Random seed, derived from the run's (string seeds hash the same in every process)."""
    return f"bc-sim-workload:{seed}"


def check_input(
    nodes: int, chaos: str, break_rule: str | None, gateways: int, health: bool = False, instances: bool = False
) -> None:
    """Bad input as one sentence (exit 2), before anything is built."""
    from bc.sim.breaks import RULES
    from bc.sim.chaos import LEVELS

    if not 1 <= nodes <= MAX_NODES:
        raise UsageError(f"--nodes must be between 1 and {MAX_NODES:,}, not {nodes:,}")
    if chaos not in LEVELS:
        raise UsageError(f"unknown chaos level {chaos!r}; levels are {', '.join(LEVELS)}")
    if break_rule is not None and break_rule not in RULES:
        raise UsageError(f"unknown --break rule {break_rule!r}; rules are {', '.join(sorted(RULES))}")
    if not 1 <= gateways <= MAX_GATEWAYS:
        raise UsageError(f"--gateways must be between 1 and {MAX_GATEWAYS}, not {gateways}")
    if chaos == "storm" and gateways < 2:
        raise UsageError("--chaos storm takes the shared store out: it needs --gateways 2 or more")
    if break_rule is not None and RULES[break_rule].checker == "H1" and not health:
        raise UsageError(f"--break {break_rule} breaks the health reconciler, which acts only with --health")
    if break_rule is not None and RULES[break_rule].checker == "V1" and not instances:
        raise UsageError(f"--break {break_rule} breaks GPU passthrough, which runs only with --instances")


class Ticker:
    """A flag raised once a wall second by a daemon thread; `due()` reads and lowers it."""

    def __init__(self, every_s: float = 1.0) -> None:
        self._flag = threading.Event()
        self._stop = threading.Event()
        self._every = every_s
        self._thread = threading.Thread(target=self._run, name="bc-sim-progress", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self._every):
            self._flag.set()

    def __enter__(self) -> Ticker:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def due(self) -> bool:
        if self._flag.is_set():
            self._flag.clear()
            return True
        return False


@contextlib.contextmanager
def quiet_logs(quiet: bool) -> Iterator[None]:
    """Without `--log`, a thousand agents' warnings (sessions ended by chaos, reboots) stay off stderr:
    the events log (`--trace`) is the record of the run."""
    if not quiet:
        yield
        return
    root = logging.getLogger()
    handler, level = logging.NullHandler(), root.level
    root.addHandler(handler)  # a handler on the root keeps logging's last-resort printer quiet
    root.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


def progress_line(sim_s: float, total_s: float, events: int, faults: int) -> str:
    return (
        f"sim {format_duration(sim_s)} of {format_duration(total_s)}"
        f" ({100 * sim_s / total_s:.0f}%), {events:,} events, {faults:,} faults"
    )


@click.command("sim")
@click.option("--nodes", type=int, default=100, show_default=True, help="How many nodes (1 to 100,000).")
@click.option(
    "--chaos",
    default="light",
    show_default=True,
    help="Fault level: none, light, heavy or storm (heavy, with the store out 10 times an hour; --gateways 2+).",
)
@click.option("--seed", type=int, default=1, show_default=True, help="The run's seed: same seed, same digest.")
@click.option("--duration", default=DEFAULT_DURATION, show_default=True, help="Simulated time: 90s, 10m, 2h, 1d.")
@click.option(
    "--gateways",
    type=int,
    default=1,
    show_default=True,
    help="Gateway processes (1 to 8) on the one store, each node dialing all; with more than one, chaos also "
    "kills and stalls gateways and takes the store out.",
)
@click.option("--journal-files", is_flag=True, help="Agents keep SQLite journal files (same digest as in memory).")
@click.option(
    "--health",
    is_flag=True,
    help="Set a health policy at the start and add XID storms to the chaos; checks H1 (off: digests as before).",
)
@click.option(
    "--instances",
    is_flag=True,
    help="VMs with passed-through GPUs on every node and instance reservations; checks V1 (off: digests as before).",
)
@click.option("--trace", type=click.Path(dir_okay=False, path_type=Path), help="Write the events log here (JSONL).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document instead of the summary.")
@click.option("--break", "break_rule", default=None, help="Run with a deliberate bug, to see its checker fail.")
@click.option("--log", "show_log", is_flag=True, help="Print the simulated processes' logs (warnings and up).")
@click.option(
    "--coverage",
    "show_coverage",
    is_flag=True,
    help="Also print how often each invariant's dangerous situation happened (always in --json).",
)
@click.option("--seeds", default=None, metavar="SPEC", help="Sweep these seeds instead of one: 1-50, 1,3,7-9.")
@click.option(
    "--parallel",
    type=click.IntRange(1, 64),
    default=None,
    help="Seeds run at once in a sweep (default: the host's cores).",
)
def sim(
    nodes: int,
    chaos: str,
    seed: int,
    duration: str,
    gateways: int,
    journal_files: bool,
    health: bool,
    instances: bool,
    trace: Path | None,
    as_json: bool,
    break_rule: str | None,
    show_log: bool,
    show_coverage: bool,
    seeds: str | None,
    parallel: int | None,
) -> None:
    """Simulate a fleet on virtual time under seeded chaos and check the fleet invariants."""
    check_input(nodes, chaos, break_rule, gateways, health, instances)
    duration_s = parse_duration(duration, what="--duration")
    if seeds is not None:
        if trace is not None:
            raise UsageError("--trace records one run: give --seed, not --seeds")
        run_sweep(
            seeds,
            parallel or os.cpu_count() or 1,
            nodes=nodes,
            chaos=chaos,
            duration_s=float(duration_s),
            gateways=gateways,
            journal_files=journal_files,
            break_rule=break_rule,
            health=health,
            instances=instances,
            as_json=as_json,
            show_log=show_log,
        )
        return
    from bc.sim import report
    from bc.sim.chaos import LEVELS
    from bc.sim.coverage import coverage
    from bc.sim.fleet import SimConfig, run_sync
    from bc.sim.workload import make_workload

    cfg = SimConfig(
        nodes=nodes,
        seed=seed,
        chaos=next(level for level in LEVELS if level == chaos),  # checked above; typed as the Literal
        duration_s=float(duration_s),
        gateways=gateways,
        journal_files=journal_files,
        break_rule=break_rule,
        health=health,
        instances=instances,
        trace=trace,
    )
    several = f", {gateways} gateways" if gateways > 1 else ""
    echo(
        f"bc sim: {nodes:,} nodes{several}, chaos {chaos}, seed {seed}, {format_duration(duration_s)} simulated",
        err=True,
    )
    with Ticker() as ticker, quiet_logs(not show_log):

        def progress(sim_s: float, events: int, faults: int) -> None:
            if ticker.due():
                echo(progress_line(sim_s, duration_s, events, faults), err=True)

        try:
            result = run_sync(cfg, workload=make_workload(random.Random(workload_seed(seed))), progress=progress)
        except Exception as e:
            why = one_line(f"{type(e).__name__}: {e}")[:300]
            raise HarnessFailed(
                f"the simulator failed, a bug in bc sim and not in the fleet ({why}); replay: {cfg.repro()}"
            ) from e
    situations = coverage(result.facts) if result.facts is not None else None
    if as_json:
        echo(json_lines(report.to_json(result, cfg, situations)))
    else:
        echo(text_lines(report.summary(result, cfg, situations if show_coverage else None)))
    failed = [i for i in result.invariants if not i.ok]
    if failed:
        first = failed[0]
        raise InvariantFailed(
            f"{len(failed)} invariant(s) failed, first {first.id} ({first.name}); replay: {result.repro}"
        )


def run_sweep(
    spec: str,
    parallel: int,
    *,
    nodes: int,
    chaos: str,
    duration_s: float,
    gateways: int,
    journal_files: bool,
    break_rule: str | None,
    as_json: bool,
    show_log: bool,
    health: bool = False,
    instances: bool = False,
) -> None:
    from bc.sim.chaos import LEVELS
    from bc.sim.fleet import SimConfig, repro_at, seed_outcome
    from bc.sim.sweep import line, parse_seeds, summary, sweep

    seeds = parse_seeds(spec)
    shape = SimConfig(
        nodes=nodes,
        seed=seeds[0],
        chaos=next(level for level in LEVELS if level == chaos),
        duration_s=duration_s,
        gateways=gateways,
        journal_files=journal_files,
        break_rule=break_rule,
        health=health,
        instances=instances,
    )
    several = f", {gateways} gateways" if gateways > 1 else ""
    broken = f", break {break_rule}" if break_rule else ""
    echo(
        f"bc sim: {len(seeds)} seeds, {parallel} at a time: {nodes:,} nodes{several}, chaos {chaos}{broken},"
        f" {format_duration(duration_s)} simulated each",
        err=True,
    )

    def done(o: SeedOutcome) -> None:
        if not as_json:
            echo(line(o, breaking=break_rule is not None))

    with quiet_logs(not show_log):
        outcomes = sweep(seeds, seed_outcome, shape, parallel=parallel, repro_of=repro_at, on_done=done)
    closing = summary(outcomes, breaking=break_rule)
    if as_json:
        echo(
            json_lines(
                {
                    "seeds": [dataclasses.asdict(o) | {"ok": o.ok, "caught": o.caught} for o in outcomes],
                    "break": break_rule,
                    "caught": sum(o.caught for o in outcomes),
                    "ok": sum(o.ok for o in outcomes),
                    "harness_errors": sum(bool(o.harness_error) for o in outcomes),
                    "summary": closing,
                }
            )
        )
    else:
        echo(lines(closing))
    missed = [o for o in outcomes if not o.caught] if break_rule else [o for o in outcomes if not o.ok]
    if missed:
        what = f"missed the break {break_rule}" if break_rule else "failed"
        raise InvariantFailed(f"{len(missed)} of {len(outcomes)} seeds {what}; each one's replay is above")


COMMANDS: tuple[click.Command, ...] = (sim,)
