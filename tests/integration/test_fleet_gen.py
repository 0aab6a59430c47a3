"""The fleet generator against a real `bc serve`: 20 node sessions over gRPC and mutual TLS in a generator
process, its CPU report, a steady-state window read from /proc, and a reconnect storm that brings every one back.

Slow (about 30-60 s on 2 cores: joins, a gateway start, the storm's wait for the gateway's next stats line):
`make test-slow` runs it; `make bench-fleet` is the same code at fleet size (docs/scale.md).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bc.client.admin import AdminClient
from bc.runtime.config import OperatorConfig
from bench.fleet import Fleet, steady_state, storm
from bench.fleet_figures import last_gateway_stats
from bench.rehome import agent_procs_ready, join_fleet, spawn_agent_procs, start_gateways, store_connected
from bench.run import Lab

pytestmark = pytest.mark.slow

NODES = 20


@pytest.mark.timeout(300)
async def test_twenty_generated_sessions_measure_themselves_and_survive_a_storm(tmp_path: Path) -> None:
    lab = Lab(tmp_path)
    fleet = Fleet(tmp_path, lab, gateways=1)
    try:
        fleet.procs.update(await start_gateways(lab, tmp_path, f"sqlite:{tmp_path / 'store.db'}", [lab.address]))
        cfg = OperatorConfig.load(tmp_path / "server" / "operator" / "config.json")
        async with AdminClient(cfg, timeout_s=60) as admin:
            await join_fleet(admin, tmp_path, [lab.address], range(NODES))
            fleet.procs.update(await spawn_agent_procs(tmp_path, NODES, 1, 0.0, "bench.fleet_gen"))
            await agent_procs_ready(fleet.procs)
            listed = await store_connected(admin, NODES)
            assert {n.gateway_id for n in listed} == {"gw-0"}

            steady = await steady_state(fleet, NODES, control=0, settle_s=0.0, window_s=1.0)
            assert steady["sessions"] == NODES
            # The gateway and the generator each spent some CPU holding the sessions (heartbeats, TLS, loops).
            assert steady["server_ms_per_session_s"] > 0
            assert steady["generator_ms_per_session_s"] > 0

            (report,) = await fleet.ask("cpu")
            assert report["agents"] == NODES and report["connected"] == NODES and report["refused_for_good"] == 0

            stormed = await storm(fleet, admin, NODES)
            assert stormed["refused_for_good"] == 0
            assert 0 < stormed["all_back_s"] <= stormed["all_connected_in_store_s"]
            (after,) = await fleet.ask("cpu")
            assert after["connected"] == NODES
            # Every session was dialed anew: the gateway opened a second session for each node (its stats line
            # after the storm, which `storm` waited for, counts every Hello it committed).
            stats = last_gateway_stats((tmp_path / "gw-0.log").read_text())
            assert stats["sessions_opened"] >= 2 * NODES
    finally:
        await fleet.stop()
