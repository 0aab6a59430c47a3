"""The CommandSweeper: commands that ran out of time settle on the server's word.

Every `interval_s` (5 s), under the store lease `worker:command-sweeper` so
that one process sweeps however many run against the store:

* a `pending` command past `not_after` becomes `expired` (reason `expired`):
  the daemon would refuse it anyway, and leaving it pending would keep a
  stale intent in the queue;
* a `dispatched`, `acked` or `running` command past `not_after` plus its
  kind's timeout (`bc.protocol.kinds.timeout_s`; for self-terminating kinds it
  covers the rejoin) becomes `failed` with reason `timeout`, so a controller
  waiting on it learns the outcome is unknown instead of waiting forever.

Given `each_pass` (a `bc serve` worker passes `bc.control.quorum.spec_changes.apply_pending`),
the lease holder also runs it after each pass: it writes the approved
root-equivalent spec changes not written yet, the retry of the write
ApproveBatch tries at once, so a change approved just before a crash is
written at the next start. It is passed in, not imported, so the command
queue does not depend on the quorum that depends on it.

Each settlement is guarded by the state the sweeper read, so a result that
lands in between wins, and each publishes `command.settled`. The lease is
taken in the sweep's own transaction: a sweeper that lost it writes nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from bc.control.base.bus import Bus
from bc.control.base.events import publish
from bc.control.commands import states as cs
from bc.protocol import kinds
from bc.seams.clock import Clock
from bc.store import Row, Store, StoreError, Tx, leases
from bc.store import commands as cmd_sql

log = logging.getLogger("bc.control.commands.sweeper")

LEASE_NAME = "worker:command-sweeper"
LEASE_TTL_MS = 15_000
BATCH = 1000
_SHORTEST_TIMEOUT_MS = min(k.timeout_s for k in kinds.KINDS.values()) * 1000


class CommandSweeper:
    def __init__(
        self,
        store: Store,
        bus: Bus | None,
        holder: str,
        interval_s: float = 5.0,
        each_pass: Callable[[], Awaitable[object]] | None = None,
    ) -> None:
        self.store, self.bus, self.holder, self.interval_s = store, bus, holder, interval_s
        self.each_pass = each_pass

    async def sweep_once(self) -> list[tuple[str, str]]:
        """One pass; returns (command id, new state) for each command it settled (empty without the lease)."""
        now_ms = await self.store.now_ms()
        settled: list[tuple[str, str, str]] = []
        async with self.store.transaction() as tx:
            if not await leases.acquire(tx, LEASE_NAME, self.holder, now_ms, LEASE_TTL_MS):
                return []
            for row in await cmd_sql.pending_past(tx, now_ms, BATCH):
                cid = str(row["id"])
                if await cmd_sql.settle(
                    tx,
                    cid,
                    expected=cs.PENDING,
                    state=cs.EXPIRED,
                    reason="expired",
                    message="not dispatched before not_after",
                    now_ms=now_ms,
                ):
                    await self._settled(tx, row, cs.EXPIRED, "expired", now_ms)
                    settled.append((cid, cs.EXPIRED, str(row["node_id"])))
            for row in await cmd_sql.in_flight_past(tx, now_ms - _SHORTEST_TIMEOUT_MS, BATCH):
                timeout_ms = kinds.timeout_s(str(row["kind"])) * 1000
                if int(row["not_after_ms"]) + timeout_ms > now_ms:
                    continue
                cid = str(row["id"])
                if await cmd_sql.settle(
                    tx,
                    cid,
                    expected=str(row["state"]),
                    state=cs.FAILED,
                    reason="timeout",
                    message=f"no result {timeout_ms // 1000} s past not_after (last state {row['state']})",
                    now_ms=now_ms,
                ):
                    await self._settled(tx, row, cs.FAILED, "timeout", now_ms)
                    settled.append((cid, cs.FAILED, str(row["node_id"])))
        for cid, state, node_id in settled:
            log.info("event=command.swept command_id=%s node=%s state=%s", cid, node_id, state)
        if self.each_pass is not None:  # only the lease holder (no lease returned above): one writer per store
            await self.each_pass()
        return [(cid, state) for cid, state, _ in settled]

    async def _settled(self, tx: Tx, row: Row, state: str, reason: str, now_ms: int) -> None:
        node_id = str(row["node_id"])
        data = {"node_id": node_id, "kind": str(row["kind"]), "state": state, "reason": reason}
        await publish(tx, self.bus, "command.settled", str(row["id"]), data, now_ms)
        if self.bus is not None and str(row["state"]) in cs.IN_FLIGHT:
            bus = self.bus
            tx.on_commit(lambda: bus.node_changed(node_id))  # the gateway frees the lane's credit

    async def run_forever(self, clock: Clock) -> None:
        """Sweep every `interval_s` until cancelled; a store failure is logged and retried next pass."""
        while True:
            try:
                await self.sweep_once()
            except StoreError as e:
                log.warning("event=command-sweeper.failed error=%s", e)
            await clock.sleep(self.interval_s)
