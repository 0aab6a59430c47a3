"""One supervisor for every loop a process runs: a loop that raises is restarted, never lost.

A control-plane loop (liveness, the sweeper, placement, jobs, a gateway's
lease) that raises, on a store outage or a bug, used to end its task for
good: the process looked alive and did nothing. Under the supervisor each
loop is a named task; when its coroutine raises, the error is logged with
the loop's name, the loop waits a back-off and starts again from a fresh
coroutine. The back-off is full jitter over an exponential cap (1 s doubling
to 30 s, the injected `rng`), and resets once a run has lasted `STABLE_S`,
so a loop that fails once a day restarts at once and a loop that cannot
start (a store still down) retries at most twice a minute.

A loop that returns has finished its work (a one-shot start-up step, or a
loop told to stop): it is `done` and not restarted. Cancellation (the
process stopping) ends the loop, whatever its state.

`states()` is what `bc doctor` and the metrics read: for each loop its
state (`running`, `restarting`, `done`), since when (the injected clock),
how many times it restarted, and its last error in one line. `on_change`
(set by the process) is told each time one of them changes: `bc serve`
writes them to `<data-dir>/loops.json` (`states_json`), which `bc doctor`'s
`loops` check reads (`bc.control.doctor.checks.check_loops`).

Time is the injected clock's (virtual under `bc sim` and the tests), so a
seeded run restarts its loops at the same instants every time.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import random
from collections.abc import Awaitable, Callable, Sequence

from bc.protocol.text_safety import one_line
from bc.runtime.aio import cancel_and_wait
from bc.seams.clock import Clock

log = logging.getLogger("bc.assembly.supervisor")

BASE_S = 1.0
CAP_S = 30.0
STABLE_S = 60.0
"""A run that lasted this long before raising starts the back-off from the bottom again."""

RUNNING, RESTARTING, DONE = "running", "restarting", "done"

LoopFactory = Callable[[], Awaitable[object]]
"""Makes one run of a loop: called again for every restart (a coroutine runs only once)."""
OnChange = Callable[[list["LoopState"]], None]
"""Told every loop's state (copies) each time one changes: a loop started, restarting, running again, done."""


def backoff_s(failures: int, rng: random.Random) -> float:
    """The wait before restart number `failures` (1, 2, …) in a row: uniform over [0, min(cap, base·2^(n-1))].

    Never below a tenth of the base, so a loop that raises at once cannot spin the process.
    """
    cap = min(CAP_S, BASE_S * 2 ** max(0, min(failures - 1, 16)))
    return max(BASE_S / 10, rng.uniform(0, cap))


@dataclasses.dataclass
class LoopState:
    """What the supervisor knows of one loop, for `bc doctor` and the metrics."""

    name: str
    state: str = RUNNING
    since: float = 0.0
    restarts: int = 0
    last_error: str = ""


class Supervisor:
    """Runs named loops as tasks and restarts any that raises; `stop()` cancels them all and waits."""

    def __init__(
        self, clock: Clock, rng: random.Random, *, process: str = "", on_change: OnChange | None = None
    ) -> None:
        self._clock = clock
        self._rng = rng
        self._process = process
        self.on_change = on_change
        """Settable: a process may attach its reporter once its loops are started (one write, not one each)."""
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._states: dict[str, LoopState] = {}

    def spawn(self, name: str, factory: LoopFactory) -> asyncio.Task[None]:
        """Start loop `name` (unique in this supervisor) from `factory`, under restart."""
        if name in self._tasks:
            raise ValueError(f"a loop named {name!r} is already supervised")
        self._states[name] = LoopState(name, since=self._clock.now())
        task = asyncio.create_task(self._keep(name, factory), name=name)
        self._tasks[name] = task
        self._changed()
        return task

    def names(self) -> list[str]:
        """The supervised loops, in the order they were started."""
        return list(self._tasks)

    def states(self) -> list[LoopState]:
        """Each loop's state now, in start order (copies: the caller may keep them)."""
        return [dataclasses.replace(s) for s in self._states.values()]

    async def stop(self) -> None:
        """Cancel every loop and wait until each has ended."""
        tasks = list(self._tasks.values())
        await cancel_and_wait(tasks)

    async def _keep(self, name: str, factory: LoopFactory) -> None:
        state = self._states[name]
        failures = 0
        while True:
            started = self._clock.monotonic()
            self._set(state, RUNNING)
            try:
                await factory()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # any failure of a loop is the supervisor's to restart
                failures = 1 if self._clock.monotonic() - started >= STABLE_S else failures + 1
                wait = backoff_s(failures, self._rng)
                state.restarts += 1
                state.last_error = one_line(f"{type(e).__name__}: {e}")[:300]
                self._set(state, RESTARTING)
                log.warning(
                    "event=loop.restarting process=%s loop=%s restarts=%d in_s=%.1f error=%s",
                    self._process,
                    name,
                    state.restarts,
                    wait,
                    state.last_error,
                    exc_info=log.isEnabledFor(logging.DEBUG),
                )
                await self._clock.sleep(wait)
                continue
            self._set(state, DONE)
            return

    def _set(self, state: LoopState, to: str) -> None:
        if state.state != to:
            state.state = to
            state.since = self._clock.now()
            self._changed()

    def _changed(self) -> None:
        if self.on_change is None:
            return
        try:
            self.on_change(self.states())
        except Exception as e:  # a reporter that fails must not take the loop it reports on down with it
            log.warning("event=loop.report-failed process=%s error=%s", self._process, one_line(str(e)))


def states_json(process: str, at: float, states: Sequence[LoopState]) -> bytes:
    """What `bc serve` writes to `<data-dir>/loops.json` for `bc doctor` (`bc.control.doctor.checks.check_loops`):
    the process, when (the injected clock), and each loop's state."""
    doc = {"process": process, "at": at, "loops": [dataclasses.asdict(s) for s in states]}
    return (json.dumps(doc, indent=1) + "\n").encode()


__all__ = ["DONE", "RESTARTING", "RUNNING", "LoopState", "OnChange", "Supervisor", "backoff_s", "states_json"]
