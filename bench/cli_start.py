"""How long a CLI call takes against a running lab, beside Python and gRPC starting (issue 19).

`bc nodes --json` against a `bc serve` on the embedded store, run as an operator runs it (a new process
each time), interleaved with `python -c 'import grpc'` (the floor: any gRPC client in Python pays for it),
`python -c pass` and `bench/cli_floor.py` (the same call with no CLI: gRPC, our messages and stub, one
ListNodes over mutual TLS); the median wall time of each, the median CPU time (user + system, which the
others' load on a shared machine disturbs less), and the ratios to the gRPC import and to the bare call.
The goal is a ratio to the gRPC import of at most 1.3; above it the bench prints a warning line. It also
prints the modules `bc nodes` imports that take longest (`-X importtime`), so a regression shows where it
came from.

Usage: python -m bench.cli_start [--runs 21]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.run import Lab

GOAL_RATIO = 1.3


def _time(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall and CPU seconds (the child's user + system) of one run of `argv`."""
    with tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        p = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=err)
        _pid, status, usage = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t0
        p.returncode = os.waitstatus_to_exitcode(status)
        if p.returncode != 0:
            err.seek(0)
            sys.stderr.write(err.read().decode(errors="replace"))  # the failed run's own words, before the traceback
            raise subprocess.CalledProcessError(p.returncode, argv)
    return wall, usage.ru_utime + usage.ru_stime


def slowest_imports(argv: list[str], env: dict[str, str], top: int = 8) -> list[tuple[str, float]]:
    """The `top` modules with the largest own import time (ms) in one run of `argv` under `-X importtime`."""
    r = subprocess.run([sys.executable, "-X", "importtime", *argv], env=env, capture_output=True, text=True, check=True)
    own: list[tuple[str, float]] = []
    for line in r.stderr.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        self_us, _cumulative, name = (part.strip() for part in line.removeprefix("import time:").split("|"))
        own.append((name, int(self_us) / 1000))
    return sorted(own, key=lambda x: -x[1])[:top]


async def figures(runs: int) -> dict[str, object]:
    root = Path(tempfile.mkdtemp(prefix="bc-bench-cli-"))
    lab = Lab(root)
    try:
        await lab.serve()
        env = dict(lab.env, BC_CONFIG=str(root / "server" / "operator" / "config.json"))
        # As installed: pip compiles every module at install time, so an installed bc never compiles at start.
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        bc_nodes = [lab.bc, "nodes", "--json"]
        grpc_import = [sys.executable, "-c", "import grpc"]
        bare = [sys.executable, "-c", "pass"]
        bare_call = [sys.executable, str(Path(__file__).with_name("cli_floor.py"))]
        commands = {"bc_nodes": bc_nodes, "import_grpc": grpc_import, "python": bare, "bare_call": bare_call}
        for argv in commands.values():
            await asyncio.to_thread(_time, argv, env)  # warms the page cache and __pycache__: not counted
        wall: dict[str, list[float]] = {k: [] for k in commands}
        cpu: dict[str, list[float]] = {k: [] for k in commands}
        for _ in range(runs):
            for name, argv in commands.items():
                w, c = await asyncio.to_thread(_time, argv, env)
                wall[name].append(w)
                cpu[name].append(c)
        med = {k: round(statistics.median(v) * 1000, 1) for k, v in wall.items()}
        med_cpu = {k: round(statistics.median(v) * 1000, 1) for k, v in cpu.items()}
        imports = await asyncio.to_thread(slowest_imports, ["-m", "bc.cli.main", "nodes", "--json"], env)
        return {
            "runs": runs,
            "median_ms": med,
            "median_cpu_ms": med_cpu,
            "ratio_to_import_grpc": round(med["bc_nodes"] / med["import_grpc"], 2),
            "cpu_ratio_to_import_grpc": round(med_cpu["bc_nodes"] / med_cpu["import_grpc"], 2),
            "ratio_to_bare_call": round(med["bc_nodes"] / med["bare_call"], 2),
            "slowest_own_imports_ms": [[name, round(ms, 1)] for name, ms in imports],
        }
    finally:
        lab.stop()


def report(result: dict[str, object]) -> None:
    print("cli start-up:", json.dumps(result), flush=True)
    ratio = float(result["ratio_to_import_grpc"])  # type: ignore[arg-type]
    if ratio > GOAL_RATIO:
        print(f"WARNING: bc nodes --json took {ratio}x of `import grpc` (goal <= {GOAL_RATIO}x)", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=21)
    args = ap.parse_args()
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    report(asyncio.run(figures(args.runs)))


if __name__ == "__main__":
    main()
