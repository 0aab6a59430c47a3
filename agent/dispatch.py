"""Commands on the agent: the journal's duplicate rules, the acceptance checks, lanes, credits, locks.

A delivered command is first resolved against the journal
(`journal_rules.resolve`): a done one resends its stored result, one in flight
in this process re-attaches, one an earlier process left is settled or run
again by its retry-safety. A new command then passes the acceptance checks in
the reference's order:

1. UNSUPPORTED — the body names another node, or the kind is unknown or not
   for this agent's role;
2. `min_generation` above the applied generation — send SpecRequest and defer;
   a newer spec re-runs the checks; still behind at `not_after`: STALE_GENERATION;
3. EXPIRED — past `not_after` in server time (the Welcome offset);
4. BAD_SIGNATURE — the slot where signed intent is checked (`signature_check`);
5. BATCH_UNAPPROVED / UNBATCHED_LIMIT — the slot for the quorum (`quorum_check`);
6. BUSY — no free credit on the lane, or the journal is full. Not terminal and
   never journaled; every other rejection is journaled, so a duplicate delivery
   or a Hello replay gets the same answer.

An accepted command holds a lane credit from acceptance until its result is
journaled. `accepted` is fsynced before any side effect; a self-terminating
kind writes `running{boot_id}` right before its side effect. Each lane has a
fixed pool of workers (control 4, provision 2, bulk 1) and per-resource locks
(a GPU, a disk, an allocation) keep two lanes off one device.

Pipelined accepts (issue 19): `on_command` returns once a command is decided.
A rejection is journaled and answered before it returns, as are duplicates of
what the journal holds; an accepted command has its credit taken, is in
`active` and its `accepted` write issued, and the write's own task
(`_journal_accept`) waits for it: only once it is durable is the command
queued to its lane (so no side effect starts before) and ACKED sent. The
session thus reads the next command while this one's accept commits, and the
accepts that arrive meanwhile share the journal's next transaction and fsync
(`agent.journal_batch`). A lane's commands still reach its queue in the order
they were accepted (`Lane.accepting`), whatever order their writes end in; a
duplicate of a command whose accept is still being written is answered once
that write ends, from the journal; a cancel marks it like a queued one. A
write that fails (its transaction's commit failed: every member of the batch
fails) frees the credit, queues nothing, answers nothing, and is handed to
the session (`accept_failed`), which ends on it as it did when `on_command`
awaited the write: the gateway delivers the command again on the next one.

A worker never swallows an exception: whatever a kind raises from `parse`,
`resources` or `run` settles its command `failed` (`invalid-payload` with
the kind's sentence for bad input, `internal` otherwise), and even a failure
of the dispatcher's own bookkeeping settles it `internal`, so no command is
left unsettled holding its lane credit and locks until the kind's timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal

from google.protobuf.message import DecodeError

from agent import journal_rules as rules
from agent.kinds import executor_for
from agent.kinds.base import INTERNAL, INVALID_PAYLOAD, InvalidPayload, KindContext, KindExecutor, KindResult
from agent.resource_locks import ResourceLocks
from bc.protocol import kinds
from bc.protocol.canonical import canonical_json
from bc.protocol.pb import session_pb2
from bc.protocol.pb.session_pb2 import CommandBody, CommandUpdate, NodeMessage
from bc.seams.clock import Clock

log = logging.getLogger("agent.dispatch")

SWEEP_EVERY_S = 3600.0
ACK_WRITE_AFTER_S = 1.0
"""How long the results the gateway acked wait before they are marked acked in the journal, all in one write.

An ack's mark only keeps a result out of the next Hello's replay, so it need not be durable at once: one
that a crash loses sends its result again, which the gateway takes once (as after a crash between the
gateway's Ack and the mark, before). Written one Ack at a time, the marks were a third of the journal's
transactions and fsyncs under load (docs/design.md "Throughput (issue 19)"); a new session's Hello writes
the waiting marks first (`write_acks`), so a result the gateway acked is not replayed to it."""
UPGRADE_KIND = "daemon.upgrade"

Sender = Callable[[NodeMessage], Awaitable[None]]
Check = Callable[[session_pb2.Command, CommandBody], str | Awaitable[str | None] | None]
"""None to go on, or the refusal as "CODE" or "CODE: detail" (e.g. "BAD_SIGNATURE: unsigned")."""


def _no_check(cmd: session_pb2.Command, body: CommandBody) -> str | None:
    return None


@dataclass
class Accepted:
    body: CommandBody
    command: session_pb2.Command
    cancelled: bool = False
    started: bool = False
    settled: bool = False  # its terminal result is journaled
    accepted_at: float = 0.0  # the agent's monotonic clock, for the latency telemetry reports
    journaled: asyncio.Future[bool] = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    """True once `accepted` is durable, False if its write failed; not done while the write is in flight."""

    @property
    def durable(self) -> bool:
        return self.journaled.done() and self.journaled.result()


@dataclass
class Lane:
    name: str
    credits: int
    workers: int
    queue: asyncio.Queue[Accepted] = field(default_factory=asyncio.Queue)
    in_use: int = 0
    accepting: deque[Accepted] = field(default_factory=deque)
    """Accepted and not yet queued, in the order they were accepted: the queue takes them in that order,
    each once its `accepted` is durable."""


class Dispatcher:
    def __init__(
        self,
        *,
        node_id: str,
        role: str,
        journal: rules.CommandStore,
        journal_full: Callable[[], Awaitable[bool]],
        send: Sender,
        ctx: KindContext,
        clock: Clock,
        incarnation_id: str,
        boot_id: str,
        applied_generation: Callable[[], int],
        server_now_ms: Callable[[], int],
        signature_check: Check = _no_check,
        quorum_check: Check = _no_check,
        result_signer: Callable[[CommandUpdate], CommandUpdate] | None = None,
        executors: Callable[[str], KindExecutor | None] = executor_for,
        on_settled: Callable[[str, str, str, float], None] | None = None,
        held: Callable[[str], bool] = lambda _cid: False,
        upgrade_only: Callable[[], bool] = lambda: False,
    ) -> None:
        self.node_id, self.role, self.journal, self.ctx, self.clock = node_id, role, journal, ctx, clock
        self.journal_full = journal_full
        self._deliver = send  # the agent's outbox: to the open session, if any (agent.session.outbox)
        self.incarnation_id, self.boot_id = incarnation_id, boot_id
        self.applied_generation = applied_generation
        self.server_now_ms = server_now_ms
        self.signature_check, self.quorum_check = signature_check, quorum_check
        self.result_signer = result_signer
        self.executor_for = executors
        self.on_settled = on_settled
        """(lane, kind, state, seconds since accepted) for each command settled here: the telemetry's counts."""
        # Self-update (agent.upgrade.controller): the command whose swap is settled by the controller,
        # never recovered nor run again here; and whether only daemon.upgrade may run (unconfirmed swap).
        self.held, self.upgrade_only = held, upgrade_only
        self.lanes = {
            name: Lane(name, kinds.GATEWAY_CREDITS[name], kinds.AGENT_WORKERS[name]) for name in kinds.GATEWAY_CREDITS
        }
        self.locks = ResourceLocks()
        self.active: dict[str, Accepted] = {}  # accepted or running in this process
        self.deferred: dict[str, tuple[session_pb2.Command, CommandBody]] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._last_sweep = 0.0
        self._acked: list[str] = []  # acked by the gateway, not yet marked in the journal
        self._ack_writer: asyncio.Task[None] | None = None
        self._accepts: set[asyncio.Task[None]] = set()  # `accepted` writes in flight, and duplicates waiting on one
        self._failure_waiters: list[asyncio.Future[Exception]] = []  # sessions waiting in accept_failed

    # -- lifecycle -------------------------------------------------------
    async def start(self) -> list[rules.Settlement]:
        """Settle what an earlier process left (rebooted / interrupted), sweep, and start the workers."""
        now = self.clock.now()
        entries = [e for e in await self.journal.commands() if not self.held(e.command_id)]
        settlements = rules.recover(entries, self.incarnation_id, self.boot_id)
        updates = {s.command_id: self._settlement_update(s).SerializeToString() for s in settlements}
        if settlements:
            await self.journal.apply_settlements(settlements, updates, now)
            for s in settlements:
                log.info("event=command.recovered command=%s outcome=%s", s.command_id, s.outcome)
        await self.journal.sweep_commands(now, self.incarnation_id)
        self._last_sweep = now
        for lane in self.lanes.values():
            for i in range(lane.workers):
                self._tasks.append(asyncio.create_task(self._worker(lane), name=f"lane-{lane.name}-{i}"))
        return settlements

    async def maybe_sweep(self) -> None:
        """`journal.Sweep` hourly: done entries older than 7 days go, and what earlier processes left."""
        now = self.clock.now()
        if now - self._last_sweep >= SWEEP_EVERY_S:
            self._last_sweep = now
            swept = await self.journal.sweep_commands(now, self.incarnation_id)
            if swept:
                log.info("event=journal.swept commands=%d", len(swept))

    async def stop(self) -> None:
        # The accepts in flight end first (each queues its command or fails): none is left half done.
        await asyncio.gather(*self._accepts, return_exceptions=True)
        writer, self._ack_writer = self._ack_writer, None
        for t in [*self._tasks, *([writer] if writer is not None else [])]:
            t.cancel()
        await asyncio.gather(*self._tasks, *([writer] if writer is not None else []), return_exceptions=True)
        await self.write_acks()

    def _settlement_update(self, s: rules.Settlement) -> CommandUpdate:
        if s.outcome == "rebooted":
            result = canonical_json({"rebooted": True, "previous_boot_id": s.previous_boot_id}).encode()
            return CommandUpdate(
                command_id=s.command_id,
                state=session_pb2.COMMAND_SUCCEEDED,
                reason="rebooted",
                result=result,
                boot_id=self.boot_id,
            )
        return CommandUpdate(
            command_id=s.command_id,
            state=session_pb2.COMMAND_FAILED,
            reason="interrupted",
            message="the agent stopped while this command ran; it is not safe to run again",
            boot_id=self.boot_id,
        )

    async def settle(self, command_id: str, update: CommandUpdate) -> None:
        """Journal and report a terminal update decided outside a lane (a self-update's outcome)."""
        try:
            if not await self.journal.finish(command_id, update.SerializeToString(), self.clock.now()):
                return  # settled before: that result stands, and the next Hello carries it if unacked
        except rules.UnknownCommand:
            log.warning("event=command.settle-unknown command=%s", command_id)
            return
        log.info(
            "event=command.settled command=%s state=%s reason=%s",
            command_id,
            session_pb2.CommandState.Name(update.state),
            update.reason,
        )
        await self._update(update)

    async def running_ids(self) -> list[str]:
        return sorted(cid for cid, a in self.active.items() if a.durable)

    async def accept_failed(self) -> Exception:
        """Until an `accepted` write fails: its error. The session ends on it (agent.session.runner), as it
        did when `on_command` awaited the write and raised it; the gateway then delivers the command again."""
        fut: asyncio.Future[Exception] = asyncio.get_running_loop().create_future()
        self._failure_waiters.append(fut)
        try:
            return await fut
        finally:
            with contextlib.suppress(ValueError):
                self._failure_waiters.remove(fut)

    # -- sending ---------------------------------------------------------
    async def _send(self, msg: NodeMessage) -> None:
        """Without an open session the update goes nowhere: results are journaled; the next Hello carries them."""
        try:
            await self._deliver(msg)
        except Exception as e:  # a closed link: the journal keeps what matters
            log.debug("event=command.send-failed error=%s", e)

    async def _update(self, update: CommandUpdate) -> None:
        if self.result_signer is not None:
            update = self.result_signer(update)  # attested: the node's key signs every result it reports
        await self._send(NodeMessage(command_update=update))

    # -- delivery ----------------------------------------------------------
    async def on_command(self, cmd: session_pb2.Command) -> None:
        body = CommandBody()
        try:
            body.ParseFromString(cmd.envelope.body)
        except DecodeError:
            log.warning("event=command.undecodable")
            return
        if not body.id:
            return
        pending = self.active.get(body.id)
        if pending is not None and not pending.journaled.done():
            # Its accept is being written, and the journal cannot tell yet: answer from it once it can.
            self._track(asyncio.create_task(self._after_accept(pending, cmd), name=f"duplicate-{body.id}"))
            return
        if self.held(body.id):  # a self-update in flight: the controller settles it
            await self._update(
                CommandUpdate(command_id=body.id, state=session_pb2.COMMAND_RUNNING, boot_id=self.boot_id)
            )
            return
        entry = await self.journal.get_command(body.id)
        res = rules.resolve(entry, self.incarnation_id, self.boot_id)
        if res is rules.Resolution.RESEND and entry is not None and entry.result is not None:
            await self._update(CommandUpdate.FromString(entry.result))
            return
        if res is rules.Resolution.REATTACH:
            a = self.active.get(body.id)
            state = session_pb2.COMMAND_RUNNING if a and a.started else session_pb2.COMMAND_ACKED
            await self._update(CommandUpdate(command_id=body.id, state=state, boot_id=self.boot_id))
            return
        if res in (rules.Resolution.REBOOTED, rules.Resolution.INTERRUPTED) and entry is not None:
            outcome: Literal["rebooted", "interrupted"] = (
                "rebooted" if res is rules.Resolution.REBOOTED else "interrupted"
            )
            s = rules.Settlement(body.id, outcome, entry.boot_id)
            update = self._settlement_update(s)
            await self.journal.apply_settlements([s], {body.id: update.SerializeToString()}, self.clock.now())
            await self._update(update)
            return
        await self._check_and_accept(cmd, body)

    async def _reject(self, body: CommandBody, reason: str, message: str = "") -> None:
        update = CommandUpdate(
            command_id=body.id, state=session_pb2.COMMAND_REJECTED, reason=reason, message=message, boot_id=self.boot_id
        )
        if reason != "BUSY":  # BUSY is never journaled
            await self.journal.record_done(
                body.id, body.kind, update.SerializeToString(), self.incarnation_id, self.boot_id, self.clock.now()
            )
        log.info("event=command.rejected command=%s kind=%s reason=%s", body.id, body.kind, reason)
        await self._update(update)

    async def _check_and_accept(self, cmd: session_pb2.Command, body: CommandBody) -> None:
        kind = kinds.get(body.kind)
        if body.node_id != self.node_id:
            return await self._reject(body, "UNSUPPORTED", f"the command is for node {body.node_id!r}")
        if kind is None or self.executor_for(body.kind) is None or self.role not in kind.roles:
            return await self._reject(body, "UNSUPPORTED", f"kind {body.kind!r} is not run by a {self.role} agent")
        if self.upgrade_only() and body.kind != UPGRADE_KIND:
            return await self._reject(
                body, "UNSUPPORTED", "the agent runs a new release that is not confirmed yet: only daemon.upgrade runs"
            )
        if body.min_generation > self.applied_generation():
            if body.not_after_ms and self.server_now_ms() >= body.not_after_ms:
                return await self._reject(
                    body, "STALE_GENERATION", f"spec generation {body.min_generation} never arrived before not_after"
                )
            if body.id not in self.deferred:
                self.deferred[body.id] = (cmd, body)
                await self._send(
                    NodeMessage(
                        spec_request=session_pb2.SpecRequest(
                            have_generation=self.applied_generation(), reason=session_pb2.SpecRequest.MIN_GENERATION
                        )
                    )
                )
            return None
        self.deferred.pop(body.id, None)
        if body.not_after_ms <= 0 or self.server_now_ms() >= body.not_after_ms:
            return await self._reject(body, "EXPIRED", "past not_after in server time")
        for check in (self.signature_check, self.quorum_check):
            outcome = check(cmd, body)
            refusal = await outcome if inspect.isawaitable(outcome) else outcome
            if refusal:
                code, _, detail = refusal.partition(": ")
                return await self._reject(body, code, detail)
        lane = self.lanes[kind.lane]
        if lane.in_use >= lane.credits or await self.journal_full():
            return await self._reject(body, "BUSY", f"no free credit on the {lane.name} lane")
        lane.in_use += 1
        accepted = Accepted(body, cmd)
        self.active[body.id] = accepted
        lane.accepting.append(accepted)
        # The write is awaited by its own task: the session reads the next command meanwhile (see the module).
        self._track(
            asyncio.create_task(self._journal_accept(lane, kind, accepted, self.clock.now()), name=f"accept-{body.id}")
        )
        return None

    def _track(self, task: asyncio.Task[None]) -> None:
        self._accepts.add(task)
        task.add_done_callback(self._accepts.discard)

    async def _journal_accept(self, lane: Lane, kind: kinds.Kind, a: Accepted, now: float) -> None:
        """Journal `accepted`; once durable, queue the command (in its lane's order) and send ACKED."""
        body = a.body
        try:
            await self.journal.accept(
                rules.Acceptance(
                    command_id=body.id,
                    kind=body.kind,
                    retry_safe=kind.retry_safe,
                    self_terminating=kind.self_terminating,
                    incarnation_id=self.incarnation_id,
                    boot_id=self.boot_id,
                    body=a.command.envelope.body,
                    now=now,
                )
            )
        except BaseException as e:
            lane.in_use -= 1
            if self.active.get(body.id) is a:
                del self.active[body.id]
            lane.accepting.remove(a)
            a.journaled.set_result(False)
            self._queue_durable(lane)  # a later command of the lane may be durable already
            if not isinstance(e, Exception):
                raise
            log.error("event=command.accept-failed command=%s kind=%s error=%s", body.id, body.kind, e)
            for fut in self._failure_waiters:
                if not fut.done():
                    fut.set_result(e)
            return
        a.journaled.set_result(True)
        a.accepted_at = self.clock.monotonic()  # the telemetry's latency counts from the durable accept, as before
        log.info("event=command.accepted command=%s kind=%s lane=%s", body.id, body.kind, lane.name)
        # Queued before anything is awaited: a session ending mid-send must not strand an accepted command.
        self._queue_durable(lane)
        await self._update(CommandUpdate(command_id=body.id, state=session_pb2.COMMAND_ACKED, boot_id=self.boot_id))

    @staticmethod
    def _queue_durable(lane: Lane) -> None:
        """Queue the lane's accepted commands whose `accepted` is durable, up to the first still being written."""
        while lane.accepting and lane.accepting[0].durable:
            lane.queue.put_nowait(lane.accepting.popleft())

    async def _after_accept(self, pending: Accepted, cmd: session_pb2.Command) -> None:
        """A duplicate of a command whose accept was being written: resolved against the journal once written
        (re-attach); if the write failed it is answered no more than the command itself."""
        if await asyncio.shield(pending.journaled):
            await self.on_command(cmd)

    async def on_spec_applied(self) -> None:
        """A newer spec re-runs the checks of commands deferred on min_generation."""
        for cmd, _body in list(self.deferred.values()):
            await self.on_command(cmd)

    async def expire_deferred(self) -> None:
        """Deferred commands still behind at not_after are STALE_GENERATION."""
        now = self.server_now_ms()
        for cid, (_cmd, body) in list(self.deferred.items()):
            if now >= body.not_after_ms:
                self.deferred.pop(cid, None)
                await self._reject(
                    body, "STALE_GENERATION", f"spec generation {body.min_generation} never arrived before not_after"
                )

    async def on_cancel(self, cancel: session_pb2.Cancel) -> None:
        """Queued or deferred: cancelled. Started: the real outcome wins."""
        if cancel.command_id in self.deferred:
            _cmd, body = self.deferred.pop(cancel.command_id)
            update = CommandUpdate(
                command_id=body.id,
                state=session_pb2.COMMAND_CANCELLED,
                reason="cancelled",
                message=cancel.reason,
                boot_id=self.boot_id,
            )
            await self.journal.record_done(
                body.id, body.kind, update.SerializeToString(), self.incarnation_id, self.boot_id, self.clock.now()
            )
            await self._update(update)
            return
        a = self.active.get(cancel.command_id)
        if a is not None and not a.started:
            a.cancelled = True  # the worker settles it CANCELLED instead of running it

    async def on_ack(self, command_ids: list[str]) -> None:
        """The gateway holds these results: marked acked in the journal within ACK_WRITE_AFTER_S, with the
        others acked meanwhile, in one write (see ACK_WRITE_AFTER_S)."""
        if not command_ids:
            return
        self._acked.extend(command_ids)
        if self._ack_writer is None:
            self._ack_writer = asyncio.create_task(self._write_acks_later(), name="acks")

    async def _write_acks_later(self) -> None:
        await self.clock.sleep(ACK_WRITE_AFTER_S)
        self._ack_writer = None
        await self.write_acks()

    async def write_acks(self) -> None:
        """Mark every waiting ack in the journal now (a new session's Hello reads what is unacked)."""
        ids, self._acked = list(dict.fromkeys(self._acked)), []
        if not ids:
            return
        try:
            await self.journal.ack_results(ids)
        except Exception as e:  # the results stay unacked: the next Hello sends them again, the gateway takes one
            log.warning("event=command.ack-write-failed commands=%d error=%s", len(ids), e)

    # -- execution ---------------------------------------------------------
    async def _worker(self, lane: Lane) -> None:
        while True:
            a = await lane.queue.get()
            try:
                await self._execute(a)
            except Exception as e:
                # The dispatcher's own step failed (the journal, a lock, a result that is not JSON):
                # still settle, or the command holds its credit until the sweeper times it out.
                log.exception("event=command.worker-error command=%s", a.body.id)
                try:
                    await self._settle_after_error(a, e)
                except Exception:  # the worker itself must outlive any one command
                    log.exception("event=command.settle-failed command=%s", a.body.id)
            finally:
                lane.in_use -= 1
                self.active.pop(a.body.id, None)

    async def _settle_after_error(self, a: Accepted, error: Exception) -> None:
        if a.settled:
            return  # journaled; only sending failed, and the next Hello carries the result
        update = self._failure(a.body, INTERNAL, _sentence(error))
        try:
            await self._finish_update(a, update)
        except Exception:
            # The journal cannot take it either: report it anyway, so the control plane settles the
            # command and frees the credit; a restart then finds it `accepted` and recovers it.
            log.exception("event=command.journal-failed command=%s", a.body.id)
            await self._update(update)

    async def _execute(self, a: Accepted) -> None:
        body = a.body
        kind = kinds.get(body.kind)
        executor = self.executor_for(body.kind)
        assert kind is not None and executor is not None
        if a.cancelled:
            return await self._finish(a, session_pb2.COMMAND_CANCELLED, "cancelled", "cancelled before it started")
        try:
            request = executor.parse(body.payload)
            resources = executor.resources(request)
        except InvalidPayload as e:
            return await self._finish(a, session_pb2.COMMAND_FAILED, INVALID_PAYLOAD, str(e))
        except Exception as e:
            log.exception("event=command.parse-error command=%s kind=%s", body.id, body.kind)
            return await self._finish(a, session_pb2.COMMAND_FAILED, INTERNAL, _sentence(e))
        async with self.locks.hold(resources):
            if a.cancelled:
                return await self._finish(a, session_pb2.COMMAND_CANCELLED, "cancelled", "cancelled before it started")
            a.started = True
            if kind.self_terminating:
                await self.journal.mark_running(body.id, self.incarnation_id, self.boot_id, self.clock.now())
            await self._update(
                CommandUpdate(command_id=body.id, state=session_pb2.COMMAND_RUNNING, boot_id=self.boot_id)
            )
            log.info("event=command.running command=%s kind=%s", body.id, body.kind)
            try:
                result: KindResult = await executor.run(dataclasses.replace(self.ctx, command_id=body.id), request)
            except InvalidPayload as e:
                result = KindResult.failure(INVALID_PAYLOAD, str(e))
            except Exception as e:
                log.exception("event=command.failed command=%s", body.id)
                result = KindResult.failure(INTERNAL, _sentence(e))
        state = session_pb2.COMMAND_SUCCEEDED if result.ok else session_pb2.COMMAND_FAILED
        await self._finish(a, state, result.reason, result.message, result.result_bytes())
        return None

    def _failure(self, body: CommandBody, reason: str, message: str) -> CommandUpdate:
        return CommandUpdate(
            command_id=body.id, state=session_pb2.COMMAND_FAILED, reason=reason, message=message, boot_id=self.boot_id
        )

    async def _finish(
        self, a: Accepted, state: session_pb2.CommandState, reason: str, message: str, result: bytes = b""
    ) -> None:
        update = CommandUpdate(
            command_id=a.body.id, state=state, reason=reason, message=message, result=result, boot_id=self.boot_id
        )
        await self._finish_update(a, update)

    async def _finish_update(self, a: Accepted, update: CommandUpdate) -> None:
        await self.journal.finish(a.body.id, update.SerializeToString(), self.clock.now())
        a.settled = True
        if self.on_settled is not None:
            kind = kinds.get(a.body.kind)
            lane = kind.lane if kind is not None else "?"
            state = session_pb2.CommandState.Name(update.state).removeprefix("COMMAND_").lower()
            self.on_settled(lane, a.body.kind, state, max(0.0, self.clock.monotonic() - a.accepted_at))
        log.info(
            "event=command.settled command=%s kind=%s state=%s reason=%s",
            a.body.id,
            a.body.kind,
            session_pb2.CommandState.Name(update.state),
            update.reason,
        )
        await self._update(update)


def _sentence(error: Exception) -> str:
    """An unexpected error as the one line a result carries."""
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0]}" if text else type(error).__name__
