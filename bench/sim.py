"""`bc sim` figures: simulated seconds per wall second and peak memory by fleet size, and where the time goes.

Each size runs in a fresh process (`python -m bench.sim --child ...`), so its peak resident set
(`ru_maxrss`) is that run's alone: the production control plane, gateway and N agents under `light`
chaos with the simulator's workload (`bc.sim.workload`), seed 7. The simulated span shrinks as the
fleet grows so each run stays within about two minutes of wall time on the 2-core machine; what ran
is printed with the figures. The 1,000-node run is profiled (cProfile) and its own time is summed by
where the code lives: the store (`bc/store`, and the sqlite3 calls it makes), the session code (the
gateway, `bc/wire`, the agent's session), the rest of the agents (`agent/`), the links
(`bc/sim/links`), the rest of the control plane (`bc/control`, `bc/jobs`), the rest of the simulator,
the shared modules (`bc/pki`, `bc/protocol`, the clock), protobuf and cryptography, and the event loop.
Time in a C function or the standard library (json, re, contextlib) goes to the code that called it.

Usage: python -m bench.run --only sim   (or python -m bench.sim [--sizes 100,1000] [--profile-size 1000])
"""

from __future__ import annotations

import argparse
import cProfile
import json
import logging
import pstats
import random
import resource
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

SPANS_S: dict[int, tuple[int, int]] = {100: (1200, 60), 1000: (300, 60), 10_000: (5, 0)}
"""(workload and chaos, quiet period) in simulated seconds by fleet size: sized for about a minute or two of
wall time each on the 2-core machine, and at 1,000 nodes long enough that the first minute (every agent
converging and reporting at once) is not most of the run (the quiet period is cut from `bc sim`'s 300 s: it
measures nothing new here)."""

CATEGORIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("links", ("bc/sim/links",)),
    ("store", ("bc/store/",)),
    ("sessions", ("bc/gateway/", "bc/wire/", "agent/session", "agent/session_core")),
    ("agents", ("agent/",)),
    ("control plane", ("bc/control/", "bc/jobs/", "bc/api/")),
    ("simulator", ("bc/sim/", "bc/testing", "bc/seams/virtual_time", "bc/seams/network")),
    ("shared (pki, protocol, clock)", ("bc/pki/", "bc/protocol/", "bc/seams/clock", "bc/runtime/aio", "bc/seams/ids")),
    ("protobuf", ("google/protobuf",)),
    ("cryptography", ("cryptography/",)),
    ("event loop", ("asyncio/",)),
)


PASS_THROUGH = ("builtin", "standard library")
"""Where a C function or the standard library (json, re, contextlib; not asyncio) spends time on behalf of its
caller: that time goes to the caller's category, up the call graph until it reaches one of ours."""


def category(filename: str) -> str:
    path = filename.replace("\\", "/")
    for name, marks in CATEGORIES:
        if any(m in path for m in marks):
            return name
    if not path.endswith(".py"):
        return "builtin"
    return "standard library" if "/lib/python3" in path and "site-packages" not in path else "other"


def shares(stats: pstats.Stats) -> dict[str, float]:
    """Each category's share of the profiled own time, pass-through time attributed up to its callers."""
    raw: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    own: defaultdict[str, float] = defaultdict(float)
    pending: dict[Any, float] = {}
    for func, (_cc, _nc, tt, _ct, _callers) in raw.items():
        cat = category(func[0])
        if cat in PASS_THROUGH:
            pending[func] = tt
        else:
            own[cat] += tt
    for _ in range(8):  # a few levels of json -> re -> builtin reach our code; the rest stays unattributed
        later: defaultdict[Any, float] = defaultdict(float)
        for func, amount in pending.items():
            callers = raw[func][4]
            total = sum(c[2] for c in callers.values())
            if not total:
                own[category(func[0])] += amount
                continue
            for caller, c in callers.items():
                part = amount * c[2] / total
                if category(caller[0]) in PASS_THROUGH:
                    later[caller] += part
                else:
                    own[category(caller[0])] += part
        pending = dict(later)
    for func, amount in pending.items():
        own[category(func[0])] += amount
    whole = sum(own.values()) or 1.0
    return {k: round(100 * v / whole, 1) for k, v in sorted(own.items(), key=lambda kv: -kv[1])}


def child(
    nodes: int, duration_s: int, quiet_s: int, seed: int, chaos: str, profile: bool, profile_out: str | None = None
) -> dict[str, Any]:
    """One run in this process: the figures as a dict (and the profile shares when asked)."""
    from bc.cli.sim_cmds import workload_seed
    from bc.sim.chaos import LEVELS
    from bc.sim.fleet import SimConfig, run_sync
    from bc.sim.workload import FleetLike, make_workload

    logging.basicConfig(level=logging.CRITICAL)  # the agents' warnings under chaos are not the figures
    level = next(lv for lv in LEVELS if lv == chaos)
    cfg = SimConfig(nodes=nodes, seed=seed, chaos=level, duration_s=duration_s, quiet_s=quiet_s)
    workload = make_workload(random.Random(workload_seed(seed)))
    prof = cProfile.Profile() if profile else None
    started: list[float] = []  # the wall time the fleet was up (every node enrolled, its agent started)

    async def timed(fleet: FleetLike) -> None:
        started.append(time.monotonic())
        print(f"fleet up after {started[0] - t0:.1f} s", file=sys.stderr, flush=True)  # read if the run is stopped
        await workload(fleet)

    t0, c0 = time.monotonic(), time.process_time()
    if prof is not None:
        prof.enable()
    result = run_sync(cfg, workload=timed)
    if prof is not None:
        prof.disable()
    wall, cpu = time.monotonic() - t0, time.process_time() - c0
    out: dict[str, Any] = {
        "nodes": nodes,
        "chaos": chaos,
        "sim_s": result.sim_seconds,
        "wall_s": round(wall, 1),
        "sim_per_wall_s": round(result.sim_seconds / wall, 2),
        # The start (enrolling N nodes, building N agents) is not simulated time: the rate past it.
        "start_wall_s": round(started[0] - t0, 1),
        "running_sim_per_wall_s": round(result.sim_seconds / max(1e-9, wall - (started[0] - t0)), 2),
        # The run is one thread: its CPU time is the wall it takes on a machine with a core to spare, and
        # the figure to compare when other work shares the cores.
        "cpu_s": round(cpu, 1),
        "sim_per_cpu_s": round(result.sim_seconds / max(1e-9, cpu), 2),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "events": result.events,
        "faults": sum(result.faults.values()),
        "work": sum(v for k, v in result.work.items() if "." not in k or k.startswith("command.")),
        "invariants_failed": [i.id for i in result.invariants if not i.ok],
        "digest": result.digest[:16],
    }
    if prof is not None:
        stats = pstats.Stats(prof)
        out["profile_share_pct"] = shares(stats)
        if profile_out is not None:
            stats.dump_stats(profile_out)
    return out


def peak_rss_mib(pid: int) -> float | None:
    """A live process's peak resident set (VmHWM), for a run stopped at its time limit."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return None


def run(
    nodes: int,
    duration_s: int,
    quiet_s: int,
    *,
    seed: int = 7,
    chaos: str = "light",
    profile: bool = False,
    limit_s: float = 600.0,
) -> dict[str, Any]:
    """One size in a fresh process; a run past `limit_s` of wall time is stopped and reported as such."""
    cmd = [sys.executable, "-m", "bench.sim", "--child", "--nodes", str(nodes), "--duration", str(duration_s)]
    cmd += ["--quiet", str(quiet_s), "--seed", str(seed), "--chaos", chaos] + (["--profile"] if profile else [])
    with subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as p:
        try:
            out, err = p.communicate(timeout=limit_s)
        except subprocess.TimeoutExpired:
            peak = peak_rss_mib(p.pid)
            p.kill()
            _, err = p.communicate()
            up = [line for line in err.splitlines() if line.startswith("fleet up after")]
            return {
                "nodes": nodes,
                "stopped_after_wall_s": limit_s,
                "peak_rss_mib_so_far": peak,
                "start": up[0] if up else "the fleet was not up yet (nodes enrolling, first sessions)",
            }
    if p.returncode != 0:
        return {"nodes": nodes, "error": (err.strip().splitlines() or ["no output"])[-1]}
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.sim")
    p.add_argument("--sizes", default="100,1000,10000", help="fleet sizes, comma-separated")
    p.add_argument("--profile-size", type=int, default=1000, help="the size whose run is profiled (0: none)")
    p.add_argument("--chaos", default="light")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--limit", type=float, default=600.0, help="stop a size's run after this many wall seconds")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--nodes", type=int, default=100, help=argparse.SUPPRESS)
    p.add_argument("--duration", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--quiet", type=int, default=60, help=argparse.SUPPRESS)
    p.add_argument("--profile", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--profile-out", default=None, help="with --child --profile: also write the raw profile here")
    args = p.parse_args(argv)
    if args.child:
        print(
            json.dumps(
                child(args.nodes, args.duration, args.quiet, args.seed, args.chaos, args.profile, args.profile_out)
            ),
            flush=True,
        )
        return
    for nodes in (int(s) for s in args.sizes.split(",") if s.strip()):
        span, quiet = SPANS_S.get(nodes, (600, 60))
        what = (
            f"{nodes:,} nodes, {span} s of workload and chaos + {quiet} s quiet, chaos {args.chaos}, seed {args.seed}"
        )
        print(f"bc sim, {what} ...", flush=True)
        figures = run(
            nodes, span, quiet, seed=args.seed, chaos=args.chaos, profile=nodes == args.profile_size, limit_s=args.limit
        )
        print("  " + json.dumps(figures), flush=True)


if __name__ == "__main__":
    main()
