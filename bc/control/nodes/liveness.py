"""The Liveness controller: connected → disconnected → unreachable, never a release.

Sessions routed to a gateway whose lease expired are closed (epoch-fenced, so
a node that already said Hello elsewhere is untouched) and their nodes become
`disconnected`. A node whose session its gateway closed (a partition: three
missed heartbeats) becomes `unreachable` after the lease TTL (40 s); one whose
gateway died gets the gateway-loss grace on top (120 s), time enough for the
fleet to redial another gateway. Neither transition releases anything (I5).

When a sweep finds more than 20 s since the previous one (the store or this
process stalled), timed transitions are held back for 5 minutes: ages the
gateways could not flush must not read as dead nodes.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from bc.control.base.bus import Bus
from bc.control.base.events import publish
from bc.protocol import connectivity as cx
from bc.seams.clock import Clock
from bc.store import Row, Store, StoreError, Tx
from bc.store import leases as leases_sql
from bc.store import nodes as nodes_sql

log = logging.getLogger("bc.liveness")

STALL_GAP_MS = 20_000
STALL_HOLD_MS = 300_000


LEASE_NAME = "worker:liveness"


@dataclass
class LivenessConfig:
    lease_ttl_ms: int = 40_000
    unreachable_grace_ms: int = 120_000
    interval_s: float = 1.0


class Liveness:
    def __init__(self, store: Store, bus: Bus, holder: str, cfg: LivenessConfig) -> None:
        self.store, self.bus, self.holder, self.cfg = store, bus, holder, cfg
        self._last_sweep_ms: int | None = None
        self._hold_until_ms = 0

    async def run_forever(self, clock: Clock) -> None:
        """Sweep every `cfg.interval_s`; a store that is away is retried on the next pass."""
        while True:
            try:
                await self.sweep_once()
            except StoreError as e:
                log.warning("event=liveness.failed error=%s", e)
            await clock.sleep(self.cfg.interval_s)

    async def _close(self, tx: Tx, session: Row, reason: str, now_ms: int) -> bool:
        """Close the node's open session, fenced by its epoch, and say the node is disconnected (and why)."""
        node_id = str(session["node_id"])
        if not await nodes_sql.close_session(tx, node_id, int(session["session_epoch"]), now_ms, reason):
            return False
        data = {"state": cx.DISCONNECTED, "reason": reason, "gateway_id": session["gateway_id"]}
        await publish(tx, self.bus, "node.connectivity", node_id, data, now_ms)
        return True

    async def sweep_once(self) -> list[tuple[str, str]]:
        """One pass; returns the (node, new state) transitions it made."""
        now_ms = await self.store.now_ms()
        if self._last_sweep_ms is not None and now_ms - self._last_sweep_ms > STALL_GAP_MS:
            self._hold_until_ms = now_ms + STALL_HOLD_MS
            log.warning("event=liveness.stall gap_ms=%d hold_ms=%d", now_ms - self._last_sweep_ms, STALL_HOLD_MS)
        out: list[tuple[str, str]] = []
        # The gap is measured between sweeps that reached the store: attempts that failed (an outage) are no
        # sweep, so the first one after the outage sees the whole gap and holds back.
        async with self.store.transaction() as tx:
            self._last_sweep_ms = now_ms
            if not await leases_sql.acquire(tx, LEASE_NAME, self.holder, now_ms, 15_000):
                return out
            for s in await nodes_sql.open_sessions_of_dead_gateways(tx, now_ms):
                if await self._close(tx, s, cx.GATEWAY_LOST, now_ms):
                    out.append((str(s["node_id"]), cx.DISCONNECTED))
            # A gateway flushes last-seen every few seconds while a session lives. An open session silent
            # for the whole lease TTL lost its gateway's attention (a handler that died without its close
            # write): close it, fenced by its epoch, so the node's state tells the truth.
            if now_ms >= self._hold_until_ms:
                for s in await nodes_sql.silent_open_sessions(tx, now_ms - self.cfg.lease_ttl_ms):
                    if await self._close(tx, s, cx.SILENT, now_ms):
                        out.append((str(s["node_id"]), cx.DISCONNECTED))
            if now_ms >= self._hold_until_ms:
                # The table's give-up (`cx.gives_up_at`): the lease TTL after the close, plus the grace after a
                # close for one of `cx.LONG_GRACE_REASONS` (a gateway's loss).
                cutoff = now_ms - self.cfg.lease_ttl_ms
                gw_cutoff = cutoff - self.cfg.unreachable_grace_ms
                for n in await nodes_sql.disconnected_before(tx, cutoff, gw_cutoff):
                    node_id = str(n["node_id"])
                    # Only while still disconnected: on PostgreSQL a Hello on another gateway may commit
                    # between the read above and this write, and the node is then connected, not unreachable.
                    if await nodes_sql.mark_unreachable(tx, node_id, now_ms):
                        await publish(
                            tx,
                            self.bus,
                            "node.connectivity",
                            node_id,
                            {"state": cx.UNREACHABLE, "reason": "NodeUnreachable"},
                            now_ms,
                        )
                        out.append((node_id, cx.UNREACHABLE))
        return out
