"""`bc sim --gateways N`: N production gateway processes on one store, nodes dialing all of them, under gateway
kills, gateway stalls and store outages, every invariant holding.

What an operator relies on: one seed writes one events log with three gateways too; a heavy run injects
every gateway fault and passes every checker; and each fault does what the reference's failure modes say
("Gateway crash", "Gateway cut off from PostgreSQL", "PostgreSQL unavailable"), read from the run's own
events log: a killed gateway's nodes re-home at once and a new process starts at its address; a stalled
gateway wakes as a zombie and fences itself while its nodes have moved on; a store outage fences every
gateway within 10 s and marks no node unreachable.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from bc.seams.virtual_time import run as run_virtual
from bc.sim import chaos
from bc.sim.chaos import Fault
from bc.sim.fleet import SIM_WALL_START, Fleet, SimConfig, SimResult, run_fleet, run_sync, workload_for
from bc.sim.pair import _scratch_dir
from bc.sim.strikes import STRIKE_KINDS

ROOT = Path(__file__).resolve().parents[2]
BC = str(Path(sys.executable).parent / "bc")


def _spawn(hash_seed: str, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONHASHSEED": hash_seed}
    cmd = [sys.executable, "-m", "bc.sim.fleet", *args]
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _result(p: subprocess.Popen[str]) -> dict[str, Any]:
    out, err = p.communicate(timeout=600)
    assert p.returncode == 0, err
    doc: dict[str, Any] = json.loads(out)
    return doc


def test_one_seed_one_digest_with_three_gateways_across_processes_and_hash_seeds(tmp_path: Path) -> None:
    small = ("--nodes", "3", "--seed", "11", "--chaos", "heavy", "--duration", "420", "--gateways", "3")
    runs = [_spawn(h, *small, "--trace", str(tmp_path / f"{h}.jsonl")) for h in ("1", "4242")]
    a, b = (_result(p) for p in runs)
    assert (tmp_path / "1.jsonl").read_bytes() == (tmp_path / "4242.jsonl").read_bytes()
    assert a["digest"] == b["digest"] and a["faults"] == b["faults"]
    assert {chaos.GATEWAY_KILL, chaos.GATEWAY_STALL, chaos.STORE_OUTAGE} <= set(a["faults"])
    log = [json.loads(line) for line in (tmp_path / "1.jsonl").read_text().splitlines()]
    assert Counter(json.loads(e[3])["kind"] for e in log if e[1] == "sim.fault") == Counter(a["faults"])
    started = [e for e in log if e[1] == "sim.gateway" and json.loads(e[3])["state"] == "started"]
    assert len(started) == 3 + a["faults"][chaos.GATEWAY_KILL]  # every process start is in the log
    assert all(i["ok"] for i in a["invariants"]), a["invariants"]


def test_heavy_chaos_with_three_gateways_passes_every_invariant() -> None:
    cfg = SimConfig(nodes=6, seed=3, chaos="heavy", duration_s=720, gateways=3)
    result = run_sync(cfg, workload=workload_for(cfg))
    failed = [(r.id, r.counterexample) for r in result.invariants if not r.ok]
    assert not failed, (failed, result.repro)
    drawn = set(result.faults) - set(STRIKE_KINDS)  # the strikes aimed at commands come on top (bc.sim.strikes)
    assert drawn == set(chaos.kinds_for(3))  # heavy strikes with every kind, the gateways' too
    assert all(result.faults[k] > 0 for k in chaos.GATEWAY_KINDS)
    assert result.gateway_fences > 0  # the outage (and the stall) fenced gateways
    assert result.repro == "bc sim --nodes 6 --chaos heavy --seed 3 --duration 12m --gateways 3"


# ---- one fault at a time, read from the events log ----

Event = tuple[float, str, str, dict[str, Any]]  # (simulated second, type, subject, data)


def _one_fault(fault: Fault, tmp_path: Path, break_rule: str | None = None) -> tuple[SimResult, list[Event]]:
    """Six nodes on three gateways (node i on gateway i mod 3), no other chaos, `fault` at its time; every
    invariant holds unless a `break_rule` is given."""
    trace = tmp_path / "run.jsonl"
    cfg = SimConfig(
        nodes=6, seed=5, chaos="none", duration_s=240, gateways=3, quiet_s=60, trace=trace, break_rule=break_rule
    )

    async def go() -> SimResult:
        with _scratch_dir() as root:
            fleet = Fleet(cfg, root)
            fleet.schedule = [fault]
            return await run_fleet(fleet)

    result = run_virtual(go())
    failed = [(r.id, r.counterexample) for r in result.invariants if not r.ok]
    assert break_rule is not None or not failed, failed
    events = []
    for line in trace.read_text().splitlines():
        _seq, type_, subject, data, at_ms = json.loads(line)
        events.append((round(at_ms / 1000 - SIM_WALL_START, 3), type_, subject, json.loads(data)))
    return result, events


def _connected(events: list[Event]) -> list[tuple[float, str, str, int]]:
    """(when, node, gateway id, epoch) of every Hello that routed a node."""
    return [
        (t, s, d["gateway_id"], d["epoch"])
        for t, ty, s, d in events
        if ty == "node.connectivity" and d["state"] == "connected"
    ]


def _gateway_ids(events: list[Event], addr: str) -> list[str]:
    return [d["gateway_id"] for _, ty, s, d in events if ty == "sim.gateway" and s == addr and d["state"] == "started"]


def test_a_killed_gateways_nodes_rehome_at_once_and_a_new_process_starts(tmp_path: Path) -> None:
    result, events = _one_fault(Fault(60.0, chaos.GATEWAY_KILL, ("gw-1",), {"down_s": 60.0}), tmp_path)
    first, second = _gateway_ids(events, "gw-1")  # a new process, with a new id, 60 s later
    assert first != second
    moved = [(t, n, gw) for t, n, gw, epoch in _connected(events) if epoch == 2]
    assert sorted(n for _, n, _ in moved) == ["n001", "n004"]  # gw-1's nodes, and only them
    assert all(60.0 < t < 62.0 and gw != first for t, _, gw in moved)  # re-homed within 2 s
    assert not [e for e in events if e[1] == "node.connectivity" and e[3]["state"] == "unreachable"]
    assert result.faults == Counter({chaos.GATEWAY_KILL: 1})


def test_a_stalled_gateway_wakes_fenced_after_its_nodes_rehomed(tmp_path: Path) -> None:
    """The zombie gateway (reference "Gateway cut off from PostgreSQL"): frozen 40 s, past its 20 s lease.
    Liveness sees the lease expire and marks its nodes disconnected (gateway lost, so with the grace); the
    nodes hear nothing for three heartbeats and redial elsewhere; the gateway wakes, finds it has not renewed
    for 40 s and fences itself, closing the sessions it still thought it had."""
    result, events = _one_fault(Fault(60.0, chaos.GATEWAY_STALL, ("gw-1",), {"duration_s": 40.0}), tmp_path)
    (stalled,) = _gateway_ids(events, "gw-1")  # the same process before and after: a stall is no restart
    lost = [(t, s) for t, ty, s, d in events if ty == "node.connectivity" and d.get("reason") == "gateway-lost"]
    assert sorted(s for _, s in lost) == ["n001", "n004"] and all(75 <= t <= 85 for t, _ in lost)
    moved = [(t, n, gw) for t, n, gw, epoch in _connected(events) if epoch == 2]
    assert sorted(n for _, n, _ in moved) == ["n001", "n004"]
    assert all(85 < t < 100 and gw != stalled for t, _, gw in moved)  # re-homed before the gateway woke
    fences = [(d["t_s"], d) for _, ty, s, d in events if ty == "sim.gateway" and d["state"] == "fenced"]
    assert len(fences) == 1 and fences[0][0] == 100.0  # as it woke, and only that gateway
    assert fences[0][1]["gateway_id"] == stalled and fences[0][1]["why"].startswith("no lease renewal")
    assert not [e for e in events if e[1] == "node.connectivity" and e[3]["state"] == "unreachable"]
    assert result.gateway_fences == 1


def test_a_zombie_gateway_that_ignores_the_epoch_fence_is_caught() -> None:
    """`--break ignore-epoch-fence` with several gateways: the stalled gateway wakes and closes the sessions
    it still holds, writing their nodes disconnected though each is connected through another gateway by
    then; liveness marks them unreachable while that gateway hears them (I4). The production fence writes
    nothing for a superseded epoch (the test above)."""
    stall = Fault(60.0, chaos.GATEWAY_STALL, ("gw-1",), {"duration_s": 40.0})
    with tempfile.TemporaryDirectory() as d:
        result, events = _one_fault(stall, Path(d), "ignore-epoch-fence")
    failed = {r.id: r for r in result.invariants if not r.ok}
    assert set(failed) == {"I4"}, failed
    told = failed["I4"].counterexample or ""
    assert told.startswith(("I4: n001 was marked unreachable", "I4: n004 was marked unreachable")), told
    marked = [(t, s) for t, ty, s, d in events if ty == "node.connectivity" and d["state"] == "unreachable"]
    assert sorted(s for _, s in marked) == ["n001", "n004"]  # the lease TTL after the zombie's close writes
    assert all(t == 140.0 for t, _ in marked), marked


def test_a_store_outage_fences_every_gateway_within_10_s_and_marks_no_node_unreachable(tmp_path: Path) -> None:
    """Reference "PostgreSQL unavailable": gateways fence within 10 s and drop their streams, agents back off
    and keep enforcing, and after the outage the fleet reconnects with nothing marked unreachable (the
    liveness controller holds its timed transitions back after the gap)."""
    result, events = _one_fault(Fault(60.0, chaos.STORE_OUTAGE, (chaos.STORE,), {"duration_s": 60.0}), tmp_path)
    fences = [(s, d["t_s"]) for _, ty, s, d in events if ty == "sim.gateway" and d["state"] == "fenced"]
    assert sorted(s for s, _ in fences) == ["gw-0", "gw-1", "gw-2"]
    assert all(60.0 < t <= 70.0 for _, t in fences), fences
    assert not [e for e in events if e[1] == "node.connectivity" and e[3]["state"] == "unreachable"]
    back = {n for _, n, _, epoch in _connected(events) if epoch == 2}
    assert back == {f"n{i:03d}" for i in range(6)}  # every node had to reconnect, and did
    assert result.faults == Counter({chaos.STORE_OUTAGE: 1})


def test_the_cli_json_names_the_gateways_and_their_faults() -> None:
    out = subprocess.run(
        [BC, "sim", "--nodes", "3", "--gateways", "3", "--chaos", "heavy", "--seed", "2", "--duration", "4m", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["ok"] is True and doc["gateways"] == 3 and doc["gateway_fences"] >= 1
    assert {chaos.GATEWAY_KILL, chaos.GATEWAY_STALL, chaos.STORE_OUTAGE} <= set(doc["faults"])
    assert [i["id"] for i in doc["invariants"]] == ["I1", "I2", "I3", "I4", "I5", "I7", "I8", "Q1"]
    assert doc["repro"] == "bc sim --nodes 3 --chaos heavy --seed 2 --duration 4m --gateways 3"
    assert out.stderr.startswith("bc sim: 3 nodes, 3 gateways, chaos heavy, seed 2, 4m simulated")
