"""`bc sim`'s runner: the production control plane, gateway and agents under seeded chaos, checked.

What an operator relies on: one seed writes one events log (across processes, hash seeds and
`--journal-files`), another seed another; every fault is in the log. Heavy chaos with the standard
workload at 100 nodes for an hour, five seeds: tests/sim/test_sim_heavy_seeds.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from bc.errors import UsageError
from bc.sim import chaos
from bc.sim.fleet import SimConfig, run_sync

ROOT = Path(__file__).resolve().parents[2]


def _run(hash_seed: str, *args: str) -> dict[str, Any]:
    env = {**os.environ, "PYTHONHASHSEED": hash_seed}
    out = subprocess.run(
        [sys.executable, "-m", "bc.sim.fleet", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    result: dict[str, Any] = json.loads(out.stdout)
    return result


def test_one_seed_one_digest_across_processes_hash_seeds_and_journal_files(tmp_path: Path) -> None:
    small = ("--nodes", "4", "--seed", "11", "--chaos", "heavy", "--duration", "600")
    a = _run("1", *small, "--trace", str(tmp_path / "a.jsonl"))
    b = _run("4242", *small, "--trace", str(tmp_path / "b.jsonl"))
    files = _run("77", *small, "--journal-files")
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()
    assert a["digest"] == b["digest"] == files["digest"]
    assert a["faults"] == files["faults"] and sum(a["faults"].values()) >= len(chaos.KINDS)
    # Every fault is an event of the log the digest covers, and the run had work in it.
    log = [json.loads(line) for line in (tmp_path / "a.jsonl").read_text().splitlines()]
    faults = Counter(json.loads(e[3])["kind"] for e in log if e[1] == "sim.fault")
    assert faults == Counter(a["faults"])
    assert sum(a["work"].values()) > 0
    other = _run("1", *small[:2], "--seed", "12", *small[4:])
    assert other["digest"] != a["digest"]  # and the seed matters


@pytest.mark.parametrize("gateways", [0, 9])
def test_one_to_eight_gateways(gateways: int) -> None:
    with pytest.raises(UsageError, match="between 1 and 8"):
        run_sync(SimConfig(nodes=2, seed=1, gateways=gateways, duration_s=60))
