"""`SessionPair` figures: how fast the whole control loop runs on virtual time, printed, never asserted.

The issue-11 scenario (`bc.sim.pair.hour_with_faults`: an hour of heartbeats, a five-minute partition
of a tenth of the nodes, a 30 s control-plane restart) for 10 and 100 agents, each in a fresh process:
wall seconds, simulated seconds per wall second, events written, and the digest of the events log.

Usage: python -m bench.run --only pair   (or python -m bench.session_pair)
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(agents: int, seed: int = 7) -> dict[str, object]:
    t0 = time.monotonic()
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "bc.sim.pair",
            "--seed",
            str(seed),
            "--agents",
            str(agents),
            "--dump",
            "/dev/stdout",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    wall = time.monotonic() - t0
    lines = out.stdout.strip().splitlines()
    return {
        "agents": agents,
        "simulated_s": 3600,
        "wall_s": round(wall, 1),
        "speedup": round(3600 / wall),
        "events": len(lines) - 1,
        "digest": lines[-1][:16],
    }


def main() -> None:
    for agents in (10, 100):
        print("session pair, 1 h with a partition and a restart:", json.dumps(run(agents)), flush=True)


if __name__ == "__main__":
    main()
