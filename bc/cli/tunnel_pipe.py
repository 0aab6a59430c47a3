"""Bytes between a tunnel and something local: this process's stdin/stdout, a TCP or a unix connection.

Not text for a terminal: a tunnel's payload is a protocol stream (SSH for `ssh -o ProxyCommand='bc tunnel
%h 22'`), moved verbatim with `os.read`/`os.write` on file descriptors 0 and 1 off the event loop. So that a
node's bytes never reach a terminal unescaped (`bc.cli.output`), `stdio` refuses to run when stdout is a
terminal (`bc tunnel` says to use `bc port-forward` instead).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Awaitable, Callable

from bc.client.tunnel import OpenTunnel
from bc.errors import UsageError

CHUNK = 64 * 1024

Read = Callable[[], Awaitable[bytes]]
Write = Callable[[bytes], Awaitable[None]]


def refuse_terminal() -> None:
    if os.isatty(1):
        raise UsageError(
            "bc tunnel writes the tunnel's raw bytes to stdout, which is a terminal here: use it as ssh's"
            " ProxyCommand or redirect it, or reach the port from this machine with `bc port-forward`"
        )


async def _stdin_reader() -> Read:
    """Stdin as a Read: on the loop when it is a pipe, a socket or a terminal; else (a file) off it."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=CHUNK)
    try:
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(0, "rb", closefd=False))
    except ValueError:  # a regular file

        async def from_file() -> bytes:
            return await asyncio.to_thread(os.read, 0, CHUNK)

        return from_file

    async def from_pipe() -> bytes:
        return await reader.read(CHUNK)

    return from_pipe


async def _write_stdout(data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = await asyncio.to_thread(os.write, 1, view)
        view = view[n:]


async def splice(tunnel: OpenTunnel, read: Read, write: Write, close_local: Callable[[], None]) -> None:
    """Local bytes into the tunnel and the tunnel's out, until the tunnel ends (its far side closed or failed).

    The local side ending (EOF) half-closes the tunnel's way in; the far side's end closes the local side."""

    async def up() -> None:
        while data := await read():
            await tunnel.send(data)
        await tunnel.tls.close()  # close_notify: the node half-closes its local connection, and still answers

    async def down() -> None:
        while (data := await tunnel.recv()) is not None:
            await write(data)

    ups = asyncio.create_task(up())
    try:
        await down()
    finally:
        close_local()
        ups.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await ups


async def stdio(tunnel: OpenTunnel) -> None:
    await splice(tunnel, await _stdin_reader(), _write_stdout, lambda: None)


def stream_io(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> tuple[Read, Write, Callable[[], None]]:
    """A local stream connection (TCP, unix) as splice's three callables."""

    async def read() -> bytes:
        return await reader.read(CHUNK)

    async def write(data: bytes) -> None:
        writer.write(data)
        await writer.drain()

    return read, write, writer.close
