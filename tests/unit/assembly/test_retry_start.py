"""A process whose store is down as it starts waits for it (`bc.assembly.retry`): the helper, the harness's
control plane restarting in an outage, and a `bc sim` gateway process starting in one."""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
from pathlib import Path

import pytest

from bc.assembly.retry import retry_start
from bc.assembly.supervisor import BASE_S, RUNNING
from bc.seams import virtual_time
from bc.sim.fleet import Fleet, SimConfig
from bc.sim.pair import PairConfig, SessionPair
from bc.sim.process_store import OutageStore
from bc.store import Store, StoreError


def retried(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "event=start.retrying" in r.getMessage()]


def test_a_step_is_retried_with_back_off_until_the_store_answers(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "bc.assembly.retry")

    async def main() -> tuple[str, list[float]]:
        clock = virtual_time.virtual_clock()
        tries: list[float] = []

        async def register() -> str:
            tries.append(clock.monotonic())
            if len(tries) < 4:
                raise StoreError("the store is unavailable\nforged=1")
            return "registered"

        got = await retry_start(register, what="intent-register", clock=clock, rng=random.Random(3), process="serve")
        return got, tries

    got, tries = virtual_time.run(main())
    assert got == "registered" and len(tries) == 4
    assert all(b - a >= BASE_S / 10 for a, b in itertools.pairwise(tries))
    lines = retried(caplog)
    assert len(lines) == 3
    assert all(
        "step=intent-register" in line and "StoreError: the store is unavailable\\x0aforged=1" in line for line in lines
    )
    assert any("event=start.recovered" in r.getMessage() and "attempts=4" in r.getMessage() for r in caplog.records)


def test_a_refusal_is_not_retried() -> None:
    async def main() -> None:
        async def refused() -> None:
            raise PermissionError("another process holds the lease")

        await retry_start(refused, what="lease", clock=virtual_time.virtual_clock(), rng=random.Random(1))

    with pytest.raises(PermissionError):
        virtual_time.run(main())


class RestartInOutagePair(SessionPair):
    """The harness on a store that goes out as the control plane restarts (after it stopped, before it starts)."""

    outage_at_restart = False
    restarting_store: OutageStore | None = None

    def _make_store(self) -> Store:
        return OutageStore(self.root / "bc.db", self.clock)

    async def _open_store(self) -> Store:
        store = await super()._open_store()
        assert isinstance(store, OutageStore)
        if self.outage_at_restart:
            store.out = True
            self.restarting_store = store
        return store


@pytest.mark.parametrize("gateway", [True, False])
def test_the_harness_control_plane_restarting_in_an_outage_waits_for_the_store(
    tmp_path: Path, gateway: bool, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "bc.assembly.retry")

    async def main() -> None:
        pair = RestartInOutagePair(tmp_path, seed=11, agents=0, cfg=PairConfig(gateway=gateway))
        await pair.start()
        pair.outage_at_restart = True
        restart = asyncio.create_task(pair.restart_control_plane())
        await virtual_time.advance(120)
        assert not restart.done() and not pair.cp_up.is_set()  # waiting for the store, not dead
        assert any("process=control-plane step=intent" in line for line in retried(caplog))
        assert pair.restarting_store is not None
        pair.restarting_store.out = False  # the store is back
        async with asyncio.timeout(120):
            await pair.cp_up.wait()
        await restart
        assert pair.cp is not None and pair.cp.supervisor is not None
        assert {s.state for s in pair.cp.supervisor.states()} == {RUNNING}
        await pair.stop()

    virtual_time.run(main())


def test_a_sim_gateway_process_starting_in_an_outage_waits_for_the_store(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "bc.assembly.retry")

    async def main() -> None:
        fleet = Fleet(SimConfig(nodes=1, seed=4, gateways=2), tmp_path)
        await fleet.pair.start()
        gateways, store = fleet.pair.gateways, fleet.pair.shared_store
        assert gateways is not None and store is not None
        await gateways.kill(0)
        store.out = True
        start = asyncio.create_task(gateways.start(0))
        await virtual_time.advance(120)
        assert not start.done()
        assert any("process=gw-0 step=gateway" in line for line in retried(caplog))
        store.out = False
        async with asyncio.timeout(120):
            gw = await start
        assert gateways.procs[0].gateway is gw and gateways.procs[0].supervisor is not None
        await fleet.pair.stop()

    virtual_time.run(main())


def test_a_second_kill_of_a_sim_gateway_still_starting_kills_and_restarts_nothing(tmp_path: Path) -> None:
    """A strike and the schedule may draw the same gateway while its restart waits out a store outage: the one
    restart brings it back, and the second kill is not a harness error ('gw-0 already runs a gateway')."""

    async def main() -> None:
        fleet = Fleet(SimConfig(nodes=1, seed=4, gateways=2), tmp_path)
        await fleet.pair.start()
        gateways, store = fleet.pair.gateways, fleet.pair.shared_store
        assert gateways is not None and store is not None
        store.out = True
        first = asyncio.create_task(fleet._kill_gateway(0, 10.0))
        await virtual_time.advance(60)  # killed, and its restart waits for the store
        assert not first.done() and not gateways.procs[0].up
        async with asyncio.timeout(1):  # returns at once: nothing runs there to kill, so nothing to restart
            await fleet._kill_gateway(0, 5.0)
        store.out = False
        async with asyncio.timeout(120):
            await first
        await virtual_time.advance(30)
        assert gateways.procs[0].up and gateways.procs[0].starts == 2
        await fleet.pair.stop()

    virtual_time.run(main())
