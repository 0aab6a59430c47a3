"""`bc sim --seeds 1-50`: many seeds of one shape, in parallel processes, one line each and a summary.

A sweep is how the simulator measures itself: unbroken, every seed must hold every invariant and the
harness must inject every fault it scheduled; with `--break RULE`, every seed should catch the bug (an
invariant fails). Each seed runs in a process of its own (forked: nothing is re-imported, and the frozen
binaries fork as the zipapp does), so a seed's run is exactly `bc sim --seed S` with the same digest, and
a seed that crashes the harness is reported as a harness error with its seed, never as the sweep's crash.

`parse_seeds`, `SeedOutcome`, `line` and `summary` are pure; `sweep` is the process pool.
"""

from __future__ import annotations

import contextlib
import multiprocessing
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import TypeVar

from bc.errors import UsageError
from bc.protocol.text_safety import one_line

MAX_SEEDS = 10_000


def parse_seeds(spec: str) -> list[int]:
    """`1-50`, `7`, `1,3,10-12` as the seeds they name, in order and each once; UsageError otherwise."""
    seeds: list[int] = []
    for part in spec.split(","):
        part = part.strip()
        lo, sep, hi = part.partition("-")
        try:
            first, last = (int(lo), int(hi)) if sep else (int(part), int(part))
        except ValueError:
            raise UsageError(f"--seeds takes seeds and ranges such as 1-50 or 1,3,7-9, not {spec!r}") from None
        if first < 0 or last < first:
            raise UsageError(f"--seeds range {part!r} must go up from a seed of 0 or more")
        if last - first + 1 + len(seeds) > MAX_SEEDS:
            raise UsageError(f"--seeds names more than {MAX_SEEDS:,} seeds")
        seeds.extend(range(first, last + 1))
    return list(dict.fromkeys(seeds))


@dataclass(frozen=True)
class SeedOutcome:
    seed: int
    repro: str
    failed: tuple[str, ...] = ()
    """The invariants that failed (their ids), in the checkers' order."""
    first_failure: str = ""
    """The first failed invariant's counterexample, one line."""
    harness_error: str = ""
    """The simulator's own failure (a fault it could not inject, a crash), one line; empty when it ran."""
    digest: str = ""
    wall_seconds: float = 0.0
    sim_seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.failed and not self.harness_error

    @property
    def caught(self) -> bool:
        """With a break: an invariant saw the bug (a harness error does not count as catching it)."""
        return bool(self.failed) and not self.harness_error


def line(o: SeedOutcome, *, breaking: bool) -> str:
    """One seed as the sweep prints it."""
    if o.harness_error:
        verdict = f"HARNESS ERROR {o.harness_error}"
    elif o.failed:
        verdict = ("caught " if breaking else "FAIL ") + ",".join(o.failed)
    else:
        verdict = "missed" if breaking else "ok"
    timing = f"{o.wall_seconds:.1f}s" if o.wall_seconds else "-"
    return f"seed {o.seed:>5}  {verdict}  {timing}  digest {o.digest[:12] or '-'}"


def summary(outcomes: list[SeedOutcome], *, breaking: str | None) -> list[str]:
    """The closing lines: counts, and the command that replays each seed that needs looking at."""
    n = len(outcomes)
    errors = [o for o in outcomes if o.harness_error]
    out: list[str] = []
    if breaking:
        caught = [o for o in outcomes if o.caught]
        out.append(f"break {breaking}: caught in {len(caught)} of {n} seeds")
        look = [o for o in outcomes if not o.caught]
    else:
        failed = [o for o in outcomes if o.failed]
        out.append(f"{n - len(failed) - len(errors)} of {n} seeds held every invariant")
        by_invariant: dict[str, int] = {}
        for o in failed:
            for i in o.failed:
                by_invariant[i] = by_invariant.get(i, 0) + 1
        if by_invariant:
            out.append("violations: " + ", ".join(f"{k} in {v}" for k, v in sorted(by_invariant.items())))
        look = [o for o in outcomes if not o.ok]
    if errors:
        out.append(f"harness errors: {len(errors)} (a bug in bc sim, not in the fleet)")
    for o in sorted(look, key=lambda o: o.seed):
        out.append(f"reproduce: {o.repro}")
    return out


T = TypeVar("T")


def _child(run_one: Callable[[T, int], SeedOutcome], shape: T, seed: int, out: Connection) -> None:
    try:
        outcome = run_one(shape, seed)
    except BaseException as e:  # run_one should have said it; a last word rather than a silent exit
        outcome = SeedOutcome(seed=seed, repro="", harness_error=one_line(f"{type(e).__name__}: {e}")[:300])
    out.send(outcome)
    out.close()


def sweep(
    seeds: list[int],
    run_one: Callable[[T, int], SeedOutcome],
    shape: T,
    *,
    parallel: int,
    repro_of: Callable[[T, int], str] | None = None,
    on_done: Callable[[SeedOutcome], None] | None = None,
) -> list[SeedOutcome]:
    """Run `run_one(shape, seed)` for each seed, each in a forked process of its own, up to `parallel` at a
    time; outcomes in seed order, `on_done` told of each as it ends.

    `run_one` turns what its run raises into a harness error. A process that dies outright (a signal, out of
    memory) is a harness error of its seed alone, replayed by `repro_of(shape, seed)`: one process per seed,
    not a pool, so one death never takes its neighbours' results with it.
    """
    ctx = multiprocessing.get_context("fork")
    pending = list(seeds)
    running: dict[int, tuple[BaseProcess, Connection, int]] = {}  # by the process's sentinel
    outcomes: dict[int, SeedOutcome] = {}
    while pending or running:
        while pending and len(running) < max(1, parallel):
            seed = pending.pop(0)
            reader, writer = ctx.Pipe(duplex=False)
            proc: BaseProcess = ctx.Process(
                target=_child, args=(run_one, shape, seed, writer), name=f"bc-sim-seed-{seed}"
            )
            proc.start()
            writer.close()
            running[proc.sentinel] = (proc, reader, seed)
        for ready in wait(list(running)):
            assert isinstance(ready, int)
            done_proc, reader, seed = running.pop(ready)
            outcome: SeedOutcome | None = None
            with contextlib.suppress(EOFError, OSError):
                if reader.poll():
                    outcome = reader.recv()
            reader.close()
            done_proc.join()
            if outcome is None:
                outcome = SeedOutcome(
                    seed=seed,
                    repro=repro_of(shape, seed) if repro_of is not None else "",
                    harness_error=f"the seed's process ended (exit code {done_proc.exitcode}) before it reported",
                )
            outcomes[seed] = outcome
            if on_done is not None:
                on_done(outcome)
    return [outcomes[s] for s in seeds]


__all__ = ["MAX_SEEDS", "SeedOutcome", "line", "parse_seeds", "summary", "sweep"]
