"""`bc sim --gateways N`: N production gateways, each a process of its own on the simulator's one store,
and the dial that reaches them the way a node's does.

**The processes.** Gateway `i` lives at the address `gw-<i>` and runs what a gateway-only `bc serve` runs:
a `Gateway` with its own id (`gw-sim-<i>-<hex>`, new at every start: a new process), its own `gateway:<id>`
lease and lease loop (renewal, the self-fence of `bc.gateway.fence`), its revocation feed, its own `Bus`
(joined to the others through `bc.sim.bus_hub`, as PostgreSQL's LISTEN/NOTIFY relay does), and its own
view of the store and the clock (`bc.sim.process_store`). Three things happen to one:

* **killed** (`kill`): the process dies. Its connections reset (every node on it reads a broken stream),
  its tasks end where they are, nothing it still tries to write reaches the store (no close writes, no
  lease release), and dials to its address are refused until `start` brings up a new process there;
* **stalled** (`stall`): the process freezes for a while (a VM paused, a stop-the-world pause): its
  connections hold every frame both ways, its store calls and timers wait. It wakes with its lease gone
  and must find that out itself (the lease loop's late-wake check fences it), while the nodes it held
  have been redialing elsewhere; meanwhile its own sessions' pending work runs as a zombie's would, and
  only the production fences (the lease re-read in Hello, the epoch on routing and liveness writes)
  keep it harmless;
* nothing: it routes.

**The dial** (`dialer`) is the production agent's (`agent.session.grpc_dial`) over the one in-memory network
(`bc.seams.network.SimNetwork`, whose `start_session` opens the connection and runs its server side):
the same `Rotation` decides the order (node `i` starts on gateway `i mod N`, stays on the one it reached
unless that session was short-lived, then goes on to the next), a dead gateway (or a node cut off) is a
refused connection and the next address is tried at once, a frozen one never finishes its handshake and
is given up after `PER_ADDRESS_TIMEOUT_S`, and the server's side admits the stream as the gRPC servicer
does (`bc.api.session_servicer`: `admit()`, so a fenced or overloaded gateway refuses it, then the
revocation check) before the session runs. When no address answers, the dial fails `UNAVAILABLE` and the
agent's back-off takes over.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from agent.session.grpc_dial import PER_ADDRESS_TIMEOUT_S, Rotation
from bc.assembly.control import ControlSettings, build_control
from bc.assembly.loops import GATEWAY, start_loops
from bc.assembly.retry import retry_start
from bc.assembly.supervisor import Supervisor
from bc.control.base.bus import Bus
from bc.errors import BcError, Overloaded, Unauthenticated, Unavailable
from bc.gateway.fence import FENCE_AFTER_S, LeaseFence
from bc.gateway.sessions import Gateway
from bc.pki.identity import PeerIdentity
from bc.protocol.closing import SessionRefused
from bc.protocol.pb.session_pb2 import GatewayMessage, NodeMessage
from bc.seams.clock import Clock
from bc.seams.link import Link, LinkClosed
from bc.seams.network import SimNetwork
from bc.sim.bus_hub import BusHub
from bc.sim.process_store import Pause, ProcessClock, ProcessStore
from bc.store import Store, StoreError

log = logging.getLogger("bc.sim")

GatewayEvent = Callable[[str, str, dict[str, object]], None]
"""`on_event(address, state, data)`: a gateway process `started` (data: its gateway id) or `fenced` itself
(data: its id and why), told as it happens; the runner writes it to the events log."""
NewGateway = Callable[[str, Store, Bus, Clock], Awaitable[Gateway]]
"""`new_gateway(gateway_id, store, bus, clock)`: a process's Gateway, built as the pair builds its own (the
break's class, the pair's signer and a trust state read from the store)."""
STOP_TIMEOUT_S = 30.0


def address(index: int) -> str:
    return f"gw-{index}"


def wire_code(e: BcError) -> str:
    """The status code the gRPC servicer ends a refused stream with (`bc.wire.status`'s table)."""
    if isinstance(e, Overloaded):
        return "RESOURCE_EXHAUSTED"
    if isinstance(e, Unavailable):
        return "UNAVAILABLE"
    if isinstance(e, Unauthenticated):
        return "UNAUTHENTICATED"
    return "UNKNOWN"


@dataclass(eq=False)
class GatewayProcess:
    """One gateway's address, and the process running there now (`gateway` None: none, it was killed)."""

    index: int
    addr: str
    gateway: Gateway | None = None
    store: ProcessStore | None = None
    bus: Bus | None = None
    pause: Pause = field(default_factory=Pause)
    supervisor: Supervisor | None = None
    """The process's loops (`bc.assembly.loops`, the gateway role's)."""
    sessions: set[asyncio.Task[None]] = field(default_factory=set)
    starts: int = 0

    @property
    def up(self) -> bool:
        return self.gateway is not None

    @property
    def gateway_id(self) -> str:
        return self.gateway.gateway_id if self.gateway is not None else ""


class WatchedFence(LeaseFence):
    """A gateway's own fence, telling `on_raise(why)` each time it rises (a renewal found another owner, or
    time ran out: `moved` and `check`, which `failed` calls); the rule is the production one, unchanged."""

    def __init__(self, fence: LeaseFence, on_raise: Callable[[str], None]) -> None:
        super().__init__(fence.last_renewed, fence.fenced, fence.why)
        self.on_raise = on_raise

    def moved(self, now: float) -> bool:
        raised = super().moved(now)
        if raised:
            self.on_raise(self.why)
        return raised

    def check(self, now: float) -> bool:
        raised = super().check(now)
        if raised:
            self.on_raise(self.why)
        return raised


class GatewayFleet:
    """The N gateway processes of a run; see the module docstring."""

    roles: frozenset[str] = frozenset({GATEWAY})
    has: frozenset[str] = frozenset()
    """What each process passes to `start_loops`: a gateway-only `bc serve`'s roles, minus what only a real
    process has (a port, a serving certificate from the store: `bc.assembly.server.serve_has`)."""

    def __init__(
        self,
        n: int,
        store: Store,
        clock: Clock,
        network: SimNetwork,
        hub: BusHub,
        new_gateway: NewGateway,
        seed: int,
        *,
        on_event: GatewayEvent | None = None,
    ) -> None:
        if n < 1:
            raise ValueError("a fleet needs at least one gateway")
        self.store, self.clock, self.network, self.hub, self.new_gateway = store, clock, network, hub, new_gateway
        self.on_event = on_event
        self.fences: list[tuple[str, str, float]] = []
        """(address, gateway id, loop time) of every fence raised, in order."""
        self.rng = random.Random(f"bc-sim-gateways:{seed}")
        self._retry_rng = random.Random(f"bc-sim-gateway-start:{seed}")
        """The back-off of a process starting in a store outage (bc.assembly.retry), apart from `rng`."""
        self.procs = [GatewayProcess(i, address(i)) for i in range(n)]
        self._by_addr = {p.addr: p for p in self.procs}

    def __len__(self) -> int:
        return len(self.procs)

    # -- processes ---------------------------------------------------------------------
    async def start_all(self) -> None:
        for p in self.procs:
            await self.start(p.index)

    async def start(self, index: int) -> Gateway:
        """A new gateway process at `gw-<index>` (a new id, a new lease); waits for the store if it is out."""
        p = self.procs[index]
        assert p.gateway is None, f"{p.addr} already runs a gateway"
        p.starts += 1
        gateway_id = f"gw-sim-{index}-{self.rng.getrandbits(24):06x}"
        p.pause = Pause()
        p.bus = Bus()
        p.store = ProcessStore(self.store, p.pause)
        clock = ProcessClock(self.clock, p.pause)
        store, bus = p.store, p.bus
        gw = await retry_start(
            lambda: self.new_gateway(gateway_id, store, bus, clock),
            what="gateway",
            clock=clock,
            rng=self._retry_rng,
            process=p.addr,
        )
        gw.fence = WatchedFence(gw.fence, lambda why: self._fenced(p.addr, gateway_id, why))
        self.hub.join(p.bus)
        self._tell(p.addr, "started", {"gateway_id": gateway_id})
        try:
            await gw.renew_lease()
        except StoreError as e:  # the lease loop keeps trying (and fences the gateway meanwhile)
            log.warning("event=sim.gateway-lease-failed addr=%s error=%s", p.addr, e)
        # What a gateway-only `bc serve` builds and runs (bc.assembly), on this process's store and clock.
        parts = build_control(
            p.store,
            p.bus,
            clock,
            self.rng,
            gw.signer,
            gw.trust,
            gateway_id=gateway_id,
            worker_id=gateway_id,
            settings=ControlSettings(heartbeat_interval_s=gw.cfg.heartbeat_interval_s),
            gateway=gw,
        )
        p.supervisor = Supervisor(clock, random.Random(self.rng.getrandbits(64)), process=p.addr)
        start_loops(p.supervisor, self.roles, self.has, parts)
        p.gateway = gw
        log.info("event=sim.gateway-started addr=%s gateway=%s", p.addr, gateway_id)
        return gw

    def _fenced(self, addr: str, gateway_id: str, why: str) -> None:
        self.fences.append((addr, gateway_id, asyncio.get_running_loop().time()))
        self._tell(addr, "fenced", {"gateway_id": gateway_id, "why": why})

    def _tell(self, addr: str, state: str, data: dict[str, object]) -> None:
        if self.on_event is not None:
            self.on_event(addr, state, data)

    async def kill(self, index: int) -> list[str] | None:
        """The process at `gw-<index>` dies (see the module docstring); returns the nodes whose sessions broke,
        or None when no process runs there (already dead, or still starting: the restart of an earlier kill
        is that address's one restart, so a second kill drawn meanwhile kills nothing and restarts nothing)."""
        p = self.procs[index]
        if p.gateway is None:
            return None
        assert p.store is not None and p.bus is not None
        p.gateway = None
        p.store.kill()
        p.pause.wake()  # whatever waited on the frozen process fails now: it is gone
        self.hub.leave(p.bus)
        struck = self.network.break_gateway(p.addr)
        for t in list(p.sessions):
            t.cancel()
        await self._stop_loops(p)
        await asyncio.gather(*p.sessions, return_exceptions=True)
        return struck

    @staticmethod
    async def _stop_loops(p: GatewayProcess) -> None:
        sup, p.supervisor = p.supervisor, None
        if sup is not None:
            await sup.stop()

    async def stall(self, index: int, seconds: float) -> list[str]:
        """Freeze the process at `gw-<index>` for `seconds`; returns the nodes it held as it froze."""
        p = self.procs[index]
        if p.gateway is None:
            return []
        held = self.network.nodes_on(p.addr)
        p.pause.pause()
        self.network.stall(p.addr, seconds)
        await asyncio.sleep(seconds)
        p.pause.wake()
        return held

    def routing(self, addr: str) -> bool:
        """Whether a gateway runs at `addr` and routes by its own fence's rule now (not fenced, and renewed
        within `FENCE_AFTER_S` by its clock: a stalled process waking has not looked at its lease yet)."""
        p = self._by_addr.get(addr)
        if p is None or p.gateway is None:
            return False
        fence = p.gateway.fence
        return not fence.fenced and p.gateway.clock.monotonic() < fence.last_renewed + FENCE_AFTER_S

    def nodes_on(self, index: int) -> list[str]:
        return self.network.nodes_on(self.procs[index].addr)

    async def stop(self) -> None:
        """The end of the run: every process stops as `bc serve` does (drain, release its lease)."""
        for p in self.procs:
            p.pause.wake()
            await self._stop_loops(p)
            gw, p.gateway = p.gateway, None
            if gw is None:
                continue
            try:
                async with asyncio.timeout(STOP_TIMEOUT_S):
                    await gw.drain()
                await gw.release_lease()
            except (StoreError, TimeoutError) as e:
                log.warning("event=sim.gateway-stop-failed addr=%s error=%s", p.addr, e or "timed out")
            if p.bus is not None:
                self.hub.leave(p.bus)
        for p in self.procs:
            for t in list(p.sessions):
                t.cancel()
            await asyncio.gather(*p.sessions, return_exceptions=True)

    # -- the nodes' side ---------------------------------------------------------------
    def dialer(self, node_id: str, first: int) -> Callable[[], Awaitable[Link[GatewayMessage, NodeMessage]]]:
        """A node's dial over every gateway's address, starting at gateway `first` (see the module docstring).
        One per agent process, as the production agent builds its `Rotation` once per process."""
        rotation = Rotation([p.addr for p in self.procs])
        rotation.first = first % len(self.procs)
        net = self.network

        async def dial() -> Link[GatewayMessage, NodeMessage]:
            net.dials[node_id] += 1
            loop = asyncio.get_running_loop()
            for addr in rotation.order(loop.time()):
                p = self._by_addr[addr]
                if p.pause.paused and p.gateway is not None and not net.cut_off(node_id):
                    await asyncio.sleep(PER_ADDRESS_TIMEOUT_S)  # the handshake never finishes: give it up
                    continue
                gateway = p.gateway
                if gateway is None or net.cut_off(node_id):
                    net.stats["dials_refused"] += 1
                    continue
                rotation.connected(addr, loop.time())
                return net.start_session(node_id, functools.partial(self._serve, gateway), addr, also=(p.sessions,))
            raise LinkClosed("UNAVAILABLE", f"cannot connect to {','.join(rotation.addrs)}")

        return dial

    @staticmethod
    async def _serve(gateway: Gateway, link: Link[NodeMessage, GatewayMessage], peer: PeerIdentity) -> None:
        """The gRPC servicer's order (`bc.api.session_servicer`): admit, refuse a revoked serial, serve."""
        try:
            gateway.admit()
            await gateway.refuse_revoked(peer.serial)
        except SessionRefused as e:
            await link.close("UNAUTHENTICATED", e.message, e.reason)
            return
        except BcError as e:
            await link.close(wire_code(e), e.message)
            return
        await gateway.serve(link, peer)
