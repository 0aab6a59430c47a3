"""`make sim-sweep`: the simulator measures itself (issue 32): the catch table and the unbroken sweeps.

For each `--break` rule, with 1 gateway and with 3, `bc sim --seeds` counts the seeds that caught it; then
the unbroken shapes (1 gateway, 3 gateways, `--journal-files`, and `--chaos storm` with 3 gateways) count
the seeds that held every invariant, with harness errors apart (each one's sentence printed). Each row is
one `bc sim` command, run as an operator would (a subprocess, `--json`), and printed as it ends; the
closing table is markdown for docs/sim.md. Figures, never asserted: this exits 0 whatever it finds (a row's
own command exits 10 when it falls short).

    python -m bench.sim_sweep [--seeds 1-10] [--nodes 50] [--duration 30m] [--chaos heavy] [--parallel N]
                              [--only breaks|unbroken] [--rules a,b] [--gateways 1,3]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from bc.sim.breaks import RULES

BC = str(Path(sys.executable).parent / "bc")


@dataclass(frozen=True)
class Row:
    what: str
    gateways: int
    args: tuple[str, ...]
    breaking: bool
    chaos: str | None = None  # None: the sweep's --chaos


@dataclass(frozen=True)
class Measured:
    row: Row
    hits: int
    seeds: int
    harness_errors: int
    wall_s: float
    replays: tuple[str, ...]
    errors: tuple[str, ...] = ()  # each harness error's sentence


def rows(only: str | None, rules: list[str], gateways: tuple[int, ...] = (1, 3)) -> list[Row]:
    out: list[Row] = []
    if only in (None, "breaks"):
        for rule in rules:
            for n in gateways:
                health = ("--health",) if RULES[rule].checker == "H1" else ()  # it breaks what only --health runs
                if RULES[rule].checker == "V1":  # and this one what only --instances runs
                    health = ("--instances",)
                out.append(Row(rule, n, ("--break", rule, *health), True))
    if only in (None, "unbroken"):
        shapes = [
            Row("unbroken", 1, (), False),
            Row("unbroken", 3, (), False),
            Row("unbroken, journal files", 1, ("--journal-files",), False),
            Row("unbroken, storm", 3, (), False, chaos="storm"),
            Row("unbroken, health", 1, ("--health",), False),
        ]
        out += [r for r in shapes if r.gateways in gateways]
    return out


def measure(row: Row, shape: list[str], chaos: str) -> Measured:
    argv = [BC, "sim", *shape, "--chaos", row.chaos or chaos, "--gateways", str(row.gateways), *row.args, "--json"]
    t0 = time.monotonic()
    out = subprocess.run(argv, capture_output=True, text=True, check=False)
    wall = time.monotonic() - t0
    try:
        doc = json.loads(out.stdout)
    except json.JSONDecodeError:
        last = out.stderr.strip().splitlines()[-1:] or ["no output"]
        raise SystemExit(f"{' '.join(argv[1:])} printed no JSON (exit {out.returncode}): {last[0]}") from None
    seeds = doc["seeds"]
    hits = doc["caught"] if row.breaking else doc["ok"]
    look = [s["repro"] for s in seeds if not (s["caught"] if row.breaking else s["ok"])]
    errors = [f"seed {s['seed']}: {s['harness_error']}" for s in seeds if s.get("harness_error")]
    return Measured(row, hits, len(seeds), doc["harness_errors"], wall, tuple(look), tuple(errors))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.sim_sweep", description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", default="1-10")
    ap.add_argument("--nodes", type=int, default=50)
    ap.add_argument("--duration", default="30m")
    ap.add_argument("--chaos", default="heavy")
    ap.add_argument("--parallel", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--only", choices=("breaks", "unbroken"), default=None)
    ap.add_argument("--rules", default=",".join(sorted(RULES)), help="the --break rules to measure, comma-separated")
    ap.add_argument("--gateways", default="1,3", help="the gateway counts to measure, comma-separated")
    args = ap.parse_args(argv)
    shape = [
        "--nodes",
        str(args.nodes),
        "--duration",
        args.duration,
        "--seeds",
        args.seeds,
        "--parallel",
        str(args.parallel),
    ]
    print(f"bc sim sweeps: {args.nodes} nodes, chaos {args.chaos}, {args.duration}, seeds {args.seeds}", flush=True)
    done: list[Measured] = []
    gateways = tuple(int(g) for g in args.gateways.split(",") if g)
    for row in rows(args.only, [r for r in args.rules.split(",") if r], gateways):
        m = measure(row, shape, args.chaos)
        done.append(m)
        verb = "caught in" if row.breaking else "held in"
        errors = f", {m.harness_errors} harness errors" if m.harness_errors else ""
        print(
            f"{row.what:<28} gateways {row.gateways}: {verb} {m.hits} of {m.seeds} seeds{errors} ({m.wall_s:.0f} s)",
            flush=True,
        )
        for replay in m.replays:
            print(f"    reproduce: {replay}", flush=True)
        for error in m.errors:
            print(f"    harness error, {error}", flush=True)
    print()
    print("| Shape | Gateways | Seeds caught (breaks) or clean (unbroken) | Harness errors |")
    print("| --- | --- | --- | --- |")
    for m in done:
        chaos = f", {m.row.chaos}" if m.row.chaos else ""
        print(f"| {m.row.what}{chaos} | {m.row.gateways} | {m.hits} of {m.seeds} | {m.harness_errors} |")


if __name__ == "__main__":
    main()
