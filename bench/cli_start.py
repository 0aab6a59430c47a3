"""How long a CLI call takes against a running lab, beside Python and gRPC starting (issue 19).

`bc nodes --json` against a `bc serve` on the embedded store, run as an operator runs it (a new process
each time), interleaved with `python -c 'import grpc'` (the floor: any gRPC client in Python pays for it)
and `python -c pass`; the median of each and the ratio to the gRPC import. The goal is a ratio of at
most 1.3; below it the bench prints a warning line. It also prints the modules `bc nodes` imports that
take longest (`-X importtime`), so a regression shows where it came from.

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


def _time(argv: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return time.perf_counter() - t0


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
        await asyncio.to_thread(_time, bc_nodes, env)  # warms the page cache and __pycache__: not counted
        samples: dict[str, list[float]] = {"bc_nodes": [], "import_grpc": [], "python": []}
        for _ in range(runs):
            samples["bc_nodes"].append(await asyncio.to_thread(_time, bc_nodes, env))
            samples["import_grpc"].append(await asyncio.to_thread(_time, grpc_import, env))
            samples["python"].append(await asyncio.to_thread(_time, bare, env))
        med = {k: round(statistics.median(v) * 1000, 1) for k, v in samples.items()}
        imports = await asyncio.to_thread(slowest_imports, ["-m", "bc.cli.main", "nodes", "--json"], env)
        return {
            "runs": runs,
            "median_ms": med,
            "ratio_to_import_grpc": round(med["bc_nodes"] / med["import_grpc"], 2),
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
