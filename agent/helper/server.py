"""The helper's unix-socket server: check the peer's uid, read one request, plan it, carry it out, reply.

The socket is made 0600 and owned by the node's uid, and every connection's
peer is checked again with `SO_PEERCRED` (a socket file's mode can be changed
by root only, but a descriptor can be passed on; the kernel's credentials of
the connecting process cannot be forged). A peer of another uid gets one
refusal and the connection closes. Operations run one at a time (a lock):
the agent's convergers never need two at once, and a serial log is easier to
audit. Every operation is logged with its outcome. The TPM operations are the
exception: they wait on the TPM's own lock (agent.tpm.Tpm runs one sequence at a
time), so a node's signature is never queued behind a package install.

A stream operation (`kmsg.follow`) takes its connection for itself: the
helper answers one frame per item (agent.helper.follow) outside the lock,
until the agent closes the connection; at most `MAX_STREAMS` at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import struct
from pathlib import Path
from typing import Any

from agent.converge.host_ops import RunProcess
from agent.helper import follow, kmsg, ops, wire
from agent.helper.effects import carry_out
from agent.helper.vm_net import RootRules
from agent.hw.base import run_process
from agent.instances.vfio import SysfsVfio, VfioHost
from agent.offload import Offload, to_thread
from agent.tpm import Tpm

log = logging.getLogger(__name__)

_UCRED = struct.Struct("3i")
DRAIN_S = 5.0
MAX_STREAMS = 4


_UNLOCKED = contextlib.nullcontext()


def peer_uid(sock: socket.socket) -> int:
    """The connecting process's uid, as the kernel recorded it at connect()."""
    _pid, uid, _gid = _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
    return int(uid)


class HelperServer:
    def __init__(
        self,
        layout: ops.Layout,
        allowed_uid: int,
        *,
        run: RunProcess = run_process,
        offload: Offload = to_thread,
        tpm: Tpm | None = None,
        vfio_host: VfioHost | None = None,
        rules: RootRules | None = None,
    ) -> None:
        self.layout = layout
        self.rules = rules if rules is not None else RootRules()
        """The instances' nftables ruleset root loaded last (vm.rules), which vm.taps and the guard's tick see."""
        self.vfio_host = vfio_host if vfio_host is not None else SysfsVfio(layout.sysfs, layout.vfio_dev)
        """The VFIO edge of `vm.*` (the fake tree under `bc helper --fake-sysfs`, in tests)."""
        self.tpm = tpm
        self.allowed_uid = allowed_uid
        self.run = run
        self.offload = offload
        self._lock = asyncio.Lock()
        self.streams: set[asyncio.Task[None]] = set()
        """The connections streaming now (each its handler's task)."""
        self._closing = asyncio.Event()

    async def handle(self, request: Any) -> dict[str, Any]:
        """One request's reply; never raises for the request's sake."""
        op = request.get("op") if isinstance(request, dict) else None
        try:
            plan = ops.plan(request, self.layout)
        except ops.Refused as e:
            log.warning("event=helper.refused op=%r error=%r", str(op)[:60], str(e))
            return {"ok": False, "error": f"refused: {e}"}
        lock = _UNLOCKED if all(isinstance(e, ops.TpmCall) for e in plan) else self._lock
        async with lock:
            try:
                result = await carry_out(
                    plan,
                    run=self.run,
                    offload=self.offload,
                    tpm=self.tpm,
                    vfio_host=self.vfio_host,
                    rules=self.rules,
                )
            except ops.Refused as e:  # a check that needed the disk (the update operations)
                log.warning("event=helper.refused op=%s error=%r", op, str(e))
                return {"ok": False, "error": f"refused: {op}: {e}"}
            except (OSError, TimeoutError) as e:
                log.warning("event=helper.failed op=%s error=%r", op, str(e))
                return {"ok": False, "error": f"{op} failed: {e or type(e).__name__}"}
        log.info("event=helper.done op=%s", op)
        return {"ok": True, "result": result}

    async def stream(self, request: dict[str, Any], reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """A stream operation on this connection, until the agent closes it (or the source fails)."""
        op = request.get("op")
        try:
            (effect,) = ops.plan(request, self.layout)
            if not isinstance(effect, ops.FollowKmsg):
                raise ops.Refused(f"{op} is not a stream")
            if len(self.streams) >= MAX_STREAMS:
                raise ops.Refused(f"{op}: {MAX_STREAMS} streams are open already")
        except ops.Refused as e:
            log.warning("event=helper.refused op=%s error=%r", op, str(e))
            await wire.write_frame(writer, {"ok": False, "error": f"refused: {e}"})
            return
        task = asyncio.current_task()
        assert task is not None
        self.streams.add(task)
        try:
            await self._follow(op, effect, reader, writer)
        finally:
            self.streams.discard(task)

    async def _follow(
        self, op: object, effect: ops.FollowKmsg, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        try:
            fd = await self.offload(follow.open_source, effect.path)
        except OSError as e:
            log.warning("event=helper.failed op=%s error=%r", op, str(e))
            await wire.write_frame(writer, {"ok": False, "error": f"{op} failed: {e}"})
            return

        async def send(item: dict[str, Any]) -> None:
            await wire.write_frame(writer, {"ok": True, "result": item})

        try:
            await send({"following": str(effect.path)})  # the source is open: every record from here on comes
        except BaseException:
            os.close(fd)
            raise
        log.info("event=helper.stream-start op=%s source=%s after_seq=%d", op, effect.path, effect.after_seq)
        pump = asyncio.create_task(follow.pump(fd, effect.after_seq, send), name=f"helper-{op}")
        gone = asyncio.create_task(reader.read(1), name=f"helper-{op}-peer")  # the agent sends nothing more: EOF
        closing = asyncio.create_task(self._closing.wait(), name=f"helper-{op}-closing")
        try:
            await asyncio.wait({pump, gone, closing}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in (pump, gone, closing):
                t.cancel()
            await asyncio.wait({pump, gone, closing})  # never raises what they raised
            error = pump.exception() if pump.done() and not pump.cancelled() else None
            log.info("event=helper.stream-end op=%s error=%r", op, str(error) if error else "")

    async def close_streams(self) -> None:
        """End the streams still open (at shutdown), as if their agents had left: each handler returns (asyncio
        3.11 logs a cancelled connection handler as an error, so none is cancelled)."""
        self._closing.set()
        if self.streams:
            await asyncio.wait(set(self.streams))

    async def on_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            uid = peer_uid(writer.get_extra_info("socket"))
            if uid != self.allowed_uid:
                log.warning("event=helper.peer_refused uid=%d allowed=%d", uid, self.allowed_uid)
                await wire.write_frame(writer, {"ok": False, "error": f"refused: uid {uid} may not use this helper"})
                await _drain(reader, writer)
                return
            while True:
                try:
                    request = await wire.read_frame(reader)
                except asyncio.IncompleteReadError:
                    return
                except wire.WireError as e:
                    await wire.write_frame(writer, {"ok": False, "error": f"refused: {e}"})
                    await _drain(reader, writer)
                    return
                if request.get("op") in kmsg.STREAMS:
                    await self.stream(request, reader, writer)
                    return
                await wire.write_frame(writer, await self.handle(request))
        except (ConnectionError, OSError) as e:
            log.info("event=helper.connection_lost error=%r", str(e))
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError, OSError):
                await writer.wait_closed()

    async def start(self, path: Path) -> asyncio.AbstractServer:
        """Listen on `path` (replacing a stale socket), 0600 and owned by the allowed uid."""
        await self.offload(_unlink_stale, path)
        server = await asyncio.start_unix_server(self.on_connection, path=str(path))
        await self.offload(_restrict, path, self.allowed_uid)
        log.info("event=helper.listening socket=%s uid=%d root=%s", path, self.allowed_uid, self.layout.root)
        return server


async def _drain(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """After a refusal: let the peer read it. A unix socket closed with unread bytes resets the peer, which
    then loses the refusal; so say EOF, and discard (never parse) what it still sends, for at most 5 s."""
    if writer.can_write_eof():
        writer.write_eof()
    with contextlib.suppress(TimeoutError, ConnectionError, OSError):
        async with asyncio.timeout(DRAIN_S):
            while await reader.read(65536):
                pass


def _unlink_stale(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
    if path.is_socket():
        path.unlink()


def _restrict(path: Path, uid: int) -> None:
    os.chmod(path, 0o600)
    if os.geteuid() == 0:
        os.chown(path, uid, -1)


async def serve_forever(
    socket_path: Path,
    layout: ops.Layout,
    allowed_uid: int,
    *,
    run: RunProcess = run_process,
    tpm: Tpm | None = None,
    vfio_host: VfioHost | None = None,
) -> None:
    """`bc helper`: listen until SIGINT or SIGTERM."""
    import signal

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    helper = HelperServer(layout, allowed_uid, run=run, tpm=tpm, vfio_host=vfio_host)
    server = await helper.start(socket_path)
    async with server:
        await stop.wait()
        server.close()
        await helper.close_streams()
    log.info("event=helper.stopped socket=%s", socket_path)
