"""The store dies under a running `bc serve`'s loops (every role: api, gateway, worker) and comes back.

A lab's `bc serve` on the real SQLite file store (`SqliteStore`, its own thread), handed through its seams
(`Seams.store_opener`) a subclass that can be killed: while it is, every transaction fails at BEGIN. The
store's calls are told apart by the task that made them (the supervisor names each loop's task after it),
so the test sees each loop reach the store, fail on it, and reach it again once it is back.

* A store outage (`StoreError`, what the drivers raise for a lost connection): every loop handles it
  itself (logs, retries on its next pass), so none ends and none needs a restart;
* a failure a loop does not handle (an `OSError` the store did not wrap, as a driver's bug would let
  through): the loop raises, the supervisor restarts it with back-off while the store stays dead, and
  once it is back each one runs again; `bc doctor`'s view (`loops.json`) says `restarting` meanwhile.

Everything waits on what the store and the supervisor report (an event per call, per state change), never on
a sleep; the loops run on the host's clock, so each test takes a few seconds (the sweeper passes every 5 s).
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from bc.assembly.server import Seams, ServeOptions, Server
from bc.assembly.supervisor import RESTARTING, RUNNING, LoopState
from bc.control.doctor.checks import check_loops
from bc.pki.secrets_source import SystemSecrets, os_seeded_random
from bc.protocol.findings import Finding
from bc.seams.clock import Clock, SystemClock
from bc.store import Store, StoreError, Tx
from bc.store.sqlite import SqliteStore

BY_ROLE = {
    "api": {"api-registry"},
    "gateway": {"gateway-lease", "revocation-feed"},
    "worker": {"liveness", "command-sweeper", "jobs"},
}
"""The loops of each role that reach the store every few seconds (the others wait on events or minutes)."""
EVERY = set().union(*BY_ROLE.values())
UNHANDLED = EVERY - {"jobs"}
"""The job queue (and the placement pass) log any failure and go on (`bc.jobs.engine`: a bug must not end the
queue): no restart."""
TIMEOUT_S = 60.0


class KillableStore(SqliteStore):
    """The file store, which can be killed: `kill(error)` fails every BEGIN with `error()` until `revive()`."""

    def __init__(self, path: Path, clock: Clock) -> None:
        super().__init__(path, clock)
        self.error: Callable[[], Exception] | None = None
        self.reached: Counter[str] = Counter()
        self.failed: Counter[str] = Counter()
        self.changed = asyncio.Event()

    def kill(self, error: Callable[[], Exception]) -> None:
        self.error = error

    def revive(self) -> None:
        self.error = None

    @asynccontextmanager
    async def _begin(self, write: bool) -> AsyncIterator[Tx]:
        task = asyncio.current_task()
        name = task.get_name() if task is not None else ""
        if self.error is not None:
            self.failed[name] += 1
            self.changed.set()
            raise self.error()
        async with super()._begin(write) as tx:
            self.reached[name] += 1
            self.changed.set()
            yield tx


class Lab:
    def __init__(self, server: Server, store: KillableStore) -> None:
        self.server, self.store = server, store
        self.seen: list[LoopState] = []
        told = server.supervisor.on_change
        assert told is not None

        def on_change(states: list[LoopState]) -> None:
            told(states)
            self.seen.extend(states)
            store.changed.set()

        server.supervisor.on_change = on_change

    async def until(self, what: str, pred: Callable[[], bool]) -> None:
        """Wait for `pred`, re-checked at each store call and supervisor change."""
        try:
            async with asyncio.timeout(TIMEOUT_S):
                while not pred():
                    self.store.changed.clear()
                    await self.store.changed.wait()
        except TimeoutError:
            raise AssertionError(f"never: {what}; reached={self.store.reached} failed={self.store.failed}") from None

    def states(self) -> dict[str, LoopState]:
        return {s.name: s for s in self.server.supervisor.states()}


@asynccontextmanager
async def killable_lab(tmp_path: Path) -> AsyncIterator[Lab]:
    opened: list[KillableStore] = []

    async def opener(url: str, clock: Clock) -> Store:
        store = KillableStore(Path(url), clock)
        await store.open()
        opened.append(store)
        return store

    seams = Seams(SystemClock(), os_seeded_random(), SystemSecrets(), store_opener=opener)
    server = Server(ServeOptions(data_dir=tmp_path / "server", listen="127.0.0.1:0"), seams)
    await server.start()
    try:
        [store] = opened
        assert set(server.roles) == set(BY_ROLE) and set(server.loops) >= EVERY
        yield Lab(server, store)
    finally:
        opened[0].revive()
        await server.stop()


def reached_since(lab: Lab, mark: Counter[str], names: set[str]) -> Callable[[], bool]:
    return lambda: all(lab.store.reached[n] > mark[n] for n in names)


async def test_a_store_outage_ends_no_loop_and_each_runs_again_once_it_is_back(tmp_path: Path) -> None:
    async with killable_lab(tmp_path) as lab:
        await lab.until("every role's loops reach the store", reached_since(lab, Counter(), EVERY))

        lab.store.kill(lambda: StoreError("the store is unavailable (killed by the test)"))
        await lab.until("each loop fails on the dead store", lambda: all(lab.store.failed[n] for n in EVERY))
        assert {n: lab.states()[n].state for n in EVERY} == dict.fromkeys(EVERY, RUNNING)  # handled: none died

        mark = Counter(lab.store.reached)
        lab.store.revive()
        await lab.until("each loop reaches the store again", reached_since(lab, mark, EVERY))
        states = lab.states()
        assert {n: (states[n].state, states[n].restarts) for n in EVERY} == dict.fromkeys(EVERY, (RUNNING, 0))


async def test_a_failure_the_loops_do_not_handle_restarts_each_until_the_store_is_back(tmp_path: Path) -> None:
    async with killable_lab(tmp_path) as lab:
        await lab.until("every role's loops reach the store", reached_since(lab, Counter(), EVERY))

        lab.store.kill(lambda: ConnectionResetError(104, "the store's connection was reset (killed by the test)"))
        await lab.until(
            "the supervisor restarts each loop that raised",
            lambda: all(lab.states()[n].restarts >= 1 for n in UNHANDLED) and lab.store.failed["jobs"] > 0,
        )
        restarted = {s.name for s in lab.seen if s.state == RESTARTING}
        assert restarted >= UNHANDLED, "each restart was reported as it happened"  # the spec signer's too, if it woke
        assert "jobs" not in restarted  # it logged the failure and went on
        assert all(names & restarted for names in BY_ROLE.values()), "a loop of every role was restarted"
        assert all("ConnectionResetError" in lab.states()[n].last_error for n in UNHANDLED)
        doctor = await written(lab, lambda f: f.status == "warn")
        assert "restarting since" in doctor.message and "ConnectionResetError" in doctor.message

        mark = Counter(lab.store.reached)
        lab.store.revive()
        await lab.until("each loop runs again and reaches the store", reached_since(lab, mark, EVERY))
        await lab.until(
            "each restarted loop is running again", lambda: all(lab.states()[n].state == RUNNING for n in UNHANDLED)
        )
        doctor = await written(lab, lambda f: f.status == "pass")
        assert doctor.message.startswith(f"{len(lab.server.loops)} of {len(lab.server.loops)} running as of ")


async def written(lab: Lab, pred: Callable[[Finding], bool]) -> Finding:
    """`bc doctor`'s `loops` finding on the server's data dir, once `pred` holds for it (re-read at each write)."""
    data_dir = lab.server.opts.data_dir
    async with asyncio.timeout(TIMEOUT_S):
        while not pred(finding := check_loops(data_dir)):
            lab.server.loops_written.clear()
            await lab.server.loops_written.wait()
    return finding


async def test_a_bc_serve_whose_store_dies_as_it_starts_waits_for_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "bc.assembly.retry")
    opened: list[KillableStore] = []
    is_open = asyncio.Event()

    async def opener(url: str, clock: Clock) -> Store:
        store = KillableStore(Path(url), clock)
        await store.open()
        store.kill(lambda: StoreError("the store is unavailable (killed by the test)"))  # right after it opened
        opened.append(store)
        is_open.set()
        return store

    seams = Seams(SystemClock(), os_seeded_random(), SystemSecrets(), store_opener=opener)
    server = Server(ServeOptions(data_dir=tmp_path / "server", listen="127.0.0.1:0"), seams)
    start = asyncio.create_task(server.start())
    try:
        async with asyncio.timeout(TIMEOUT_S):
            await is_open.wait()
            store = opened[0]
            while not store.failed:  # the first store step failed (and was logged before the start slept)
                store.changed.clear()
                await store.changed.wait()
        await asyncio.sleep(0)  # one turn: a start that died of it would be done now
        assert not start.done(), "the start waits for the store instead of failing"
        line = next(m for m in caplog.messages if "event=start.retrying" in m)
        assert "process=serve step=gateway-lease attempt=1" in line and "StoreError" in line
        opened[0].revive()
        async with asyncio.timeout(TIMEOUT_S):
            await start
        assert server.loops and {s.state for s in server.supervisor.states()} == {RUNNING}
    finally:
        if opened:
            opened[0].revive()
        if start.done() and start.exception() is None:
            await server.stop()
        else:
            start.cancel()
