"""The gateway's dispatch loop: one pass for all its sessions on a poke (coalesced) or every second.

A pass is `bc.control.commands.dispatch.dispatch_gateway`; each session it planned for is handed its `SessionSends`,
which the session relays in its own task, after whatever it was sending (a Hello's replay goes first). Pokes
that arrive during a pass make one more pass right after it, however many they were. A poke names its node
(a command enqueued or settled there, a credit come free) and that pass reads the poked nodes only: under
load a fleet-wide pass per settled command would read every node's pending rows. Every node is passed over
at least every `TICK_S`, and when a pending command's `not_before` falls due.

The loop starts with the gateway's first open session and ends when none is left (`ensure_running` starts
it again), so a gateway with no sessions runs no timer; it makes no pass while the gateway is fenced.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection, Mapping

from bc.control.base.bus import Bus
from bc.control.commands.dispatch import GatewayDispatch, SessionSends, dispatch_gateway
from bc.runtime.aio import wait_event
from bc.seams.clock import Clock
from bc.store import Store, StoreError

log = logging.getLogger("bc.gateway")

TICK_S = 1.0
"""A pass at least this often while the gateway has sessions: the reference's 'every second'."""
FLOOR_S = 0.001


class Dispatcher:
    def __init__(
        self,
        store: Store,
        bus: Bus,
        clock: Clock,
        gateway_id: str,
        epochs: Callable[[Collection[str] | None], Mapping[str, int]],
        deliver: Callable[[str, SessionSends], None],
        paused: Callable[[], bool],
        track: Callable[[asyncio.Future[None]], None],
    ) -> None:
        """`epochs(only)`: the open sessions' epochs by node (of `only` when not None); `deliver` hands a session
        what it sends; `paused`: the gateway is fenced; `track` registers the loop as work the gateway waits for
        before its store closes."""
        self.store, self.bus, self.clock, self.gateway_id = store, bus, clock, gateway_id
        self._epochs, self._deliver, self._paused, self._track = epochs, deliver, paused, track
        self._wake = asyncio.Event()
        self._task: asyncio.Future[None] | None = None
        self._poked: set[str] = set()
        self._everyone = True
        self.passes = 0
        self.transactions = 0

    def poke(self, node_id: str | None = None) -> None:
        """Make a pass soon: now if the loop waits, right after the current pass if one runs. With `node_id`
        (a command enqueued or settled there, a credit come free) the pass may look at the poked nodes only;
        without, it looks at every node."""
        if node_id is None:
            self._everyone = True
        else:
            self._poked.add(node_id)
        self._wake.set()
        self.ensure_running()

    def wake(self) -> None:
        """Look at the sessions again now, without asking for a pass: with none open the loop ends."""
        self._wake.set()

    def ensure_running(self) -> None:
        if (self._task is None or self._task.done()) and self._epochs(None):
            self._task = asyncio.ensure_future(self._run())
            self._track(self._task)

    async def _run(self) -> None:
        due_at: float | None = None  # when the earliest `not_before` falls due (this loop's monotonic clock)
        full_at = self.clock.monotonic()
        while True:
            self._wake.clear()
            now = self.clock.monotonic()
            # Every node at least once a tick (and whenever a poke named none); the poked ones in between: under
            # load most pokes are one node's credit come free, and a pass over the whole fleet for it would read
            # the pending rows of every node (or walk every session for their epochs).
            everyone = self._everyone or now - full_at >= TICK_S or (due_at is not None and now >= due_at)
            nodes = None if everyone else self._poked
            epochs = dict(self._epochs(nodes))
            if not epochs and (nodes is None or not self._epochs(None)):
                return  # no session left; `ensure_running` starts the loop again with the next one
            self._poked, self._everyone = set(), False
            if everyone:
                full_at = now
            if not self._paused():
                done = await self._pass(epochs, nodes)
                if done is not None and everyone:
                    due_at = None
                    if done.next_due_ms is not None:
                        due_at = now + max(0.0, (done.next_due_ms - await self.store.now_ms()) / 1000)
            elif nodes is not None:
                self._poked |= nodes  # fenced: what was poked waits for the next pass
            timeout = full_at + TICK_S - self.clock.monotonic()
            if due_at is not None:
                timeout = min(timeout, due_at - self.clock.monotonic())
            await wait_event(self._wake, max(FLOOR_S, timeout))

    async def _pass(self, epochs: Mapping[str, int], nodes: set[str] | None) -> GatewayDispatch | None:
        try:
            done = await dispatch_gateway(self.store, self.bus, self.gateway_id, epochs, nodes=nodes)
        except StoreError as e:  # the next pass tries again; the sessions' own writes notice a store that is gone
            log.warning("event=dispatch.pass-failed gateway=%s error=%s", self.gateway_id, e)
            return None
        except Exception:  # a bug must not stop every session's commands: logged, and the next pass tries again
            log.exception("event=dispatch.pass-crashed gateway=%s", self.gateway_id)
            return None
        self.passes += 1
        self.transactions += done.transactions
        for node_id, sends in done.sends.items():
            self._deliver(node_id, sends)
        return done
