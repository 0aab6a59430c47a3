"""`bc serve`, the in-process harness and `bc sim` run the same loops for the same roles (`bc.assembly.loops`).

Each caller exposes what it passes to `start_loops` (its roles and what it has), and each started process's
supervisor lists exactly `loops_for` of those: a loop spawned by hand in one caller shows up there as a name
the table did not plan, and a `Has` a caller passes but the others cannot is the only difference allowed.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bc.assembly.loops import CA, GATEWAY, GATEWAY_CERT, LISTENER, LOOPS, OTLP, WORKER, loops_for
from bc.assembly.roles import KeyPlan
from bc.assembly.server import Seams, ServeOptions, Server, serve_has
from bc.seams.virtual_time import run as run_virtual
from bc.sim.fleet import Fleet, SimConfig
from bc.sim.gateways import GatewayFleet
from bc.sim.pair import PairConfig, SessionPair, control_plane_plan

PROCESS_ONLY = frozenset({LISTENER, CA, GATEWAY_CERT, OTLP})
"""What only a real `bc serve` has (a port, the CA key, a serving certificate from the store, an exporter):
the harness and the simulator run over in-memory links and export nothing."""
SERVE_ONLY_LOOPS = {lp.name for lp in LOOPS if lp.needs & PROCESS_ONLY}


def serve_loops(roles: frozenset[str]) -> list[str]:
    plan = KeyPlan(roles)
    # Command signing on (a new install's default): an api process holds the keys, a worker its worker key.
    has = serve_has(plan, signing=plan.ca or plan.worker_key, otlp=False)
    return [n for n in loops_for(roles, has) if n not in SERVE_ONLY_LOOPS]


@pytest.mark.parametrize("gateway", [True, False])
def test_the_harness_plans_what_bc_serve_plans_for_its_roles(gateway: bool) -> None:
    roles, has = control_plane_plan(PairConfig(gateway=gateway), signing=True)
    assert roles == ({GATEWAY, WORKER} if gateway else {WORKER})
    assert loops_for(roles, has) == serve_loops(roles)


def test_a_sim_gateway_process_plans_what_a_gateway_only_bc_serve_plans() -> None:
    assert loops_for(GatewayFleet.roles, GatewayFleet.has) == serve_loops(frozenset({GATEWAY}))


def test_the_serve_only_loops_are_the_ones_for_what_only_a_process_has() -> None:
    """Adding a `Has` only `bc serve` passes is the one way its loops may differ: it must stay visible here."""
    assert {"api-registry", "gateway-registry", "keyless", "telemetry"} == SERVE_ONLY_LOOPS


def test_the_harness_and_the_sim_gateways_start_exactly_what_they_plan(tmp_path: Path) -> None:
    async def go() -> None:
        pair = SessionPair(tmp_path / "pair", seed=5, agents=0)
        await pair.start()
        try:
            cp = pair.cp
            assert cp is not None and cp.supervisor is not None
            assert cp.supervisor.names() == loops_for(cp.roles, cp.has) == cp.loops
        finally:
            await pair.stop()

        fleet = Fleet(SimConfig(nodes=1, seed=5, gateways=2), tmp_path / "sim")
        await fleet.pair.start()
        try:
            cp = fleet.pair.cp
            assert cp is not None and cp.supervisor is not None
            assert cp.roles == {WORKER}
            assert cp.supervisor.names() == loops_for(cp.roles, cp.has)
            gateways = fleet.pair.gateways
            assert gateways is not None
            for p in gateways.procs:
                assert p.supervisor is not None
                assert p.supervisor.names() == loops_for(gateways.roles, gateways.has)
        finally:
            await fleet.pair.stop()

    run_virtual(go())


async def test_bc_serve_starts_exactly_what_it_plans(tmp_path: Path) -> None:
    server = Server(ServeOptions(data_dir=tmp_path / "server", listen="127.0.0.1:0"), Seams.production())
    await server.start()
    try:
        assert server.has == serve_has(server.plan, signing=True, otlp=False)
        assert server.supervisor.names() == loops_for(server.roles, server.has) == server.loops
        assert [n for n in server.loops if n not in SERVE_ONLY_LOOPS] == serve_loops(server.roles)
    finally:
        await server.stop()
