"""A small QMP client: qemu's JSON machine protocol over its unix socket, on asyncio.

Written here rather than taken from PyPI: `qemu.qmp` (the QEMU project's
own, the maintained one) is a sizeable library with its own logging and
event machinery for what bc needs, which is five commands. The protocol
(docs/interop/qmp-spec in qemu): on connect the server sends a greeting
`{"QMP": {...}}`; the client sends `{"execute": "qmp_capabilities"}` to leave
negotiation; then each `{"execute": cmd, "arguments": {...}}` is answered by
one `{"return": ...}` or `{"error": {"class", "desc"}}`, with asynchronous
`{"event": ...}` lines interleaved, which this client skips. One command at a
time per connection. Every read has a timeout, and `closed()` waits for the
server to hang up, which is how a caller learns that qemu has exited (an
event, not a poll).
"""

from __future__ import annotations

import array
import asyncio
import json
import os
import socket
from pathlib import Path
from types import TracebackType
from typing import Any

MAX_LINE = 1 << 20
UNIX_PATH_MAX = 107


class QmpError(Exception):
    """The server answered with an error, hung up, or did not answer in time: one sentence."""


class QmpClient:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, timeout: float) -> None:
        self._reader, self._writer, self._timeout = reader, writer, timeout

    @classmethod
    async def connect(cls, path: Path, answer_s: float = 5.0) -> QmpClient:
        """Connect and negotiate; QmpError (or OSError: nobody listens) otherwise."""
        if len(str(path).encode()) > UNIX_PATH_MAX:
            raise QmpError(f"the QMP socket path {path} is longer than a unix socket path may be")
        async with asyncio.timeout(answer_s):
            reader, writer = await asyncio.open_unix_connection(str(path), limit=MAX_LINE)
        client = cls(reader, writer, answer_s)
        try:
            greeting = await client._read()
            if "QMP" not in greeting:
                raise QmpError(f"{path} did not greet with QMP")
            await client.execute("qmp_capabilities")
        except BaseException:
            await client.close()
            raise
        return client

    async def _read(self) -> dict[str, Any]:
        try:
            async with asyncio.timeout(self._timeout):
                line = await self._reader.readline()
        except TimeoutError:
            raise QmpError(f"qemu did not answer within {self._timeout:g} s") from None
        except ValueError:
            raise QmpError("qemu sent a line longer than 1 MiB") from None
        except ConnectionError:
            raise QmpError("qemu closed the QMP connection") from None
        if not line:
            raise QmpError("qemu closed the QMP connection")
        try:
            msg = json.loads(line)
        except json.JSONDecodeError:
            raise QmpError("qemu sent a QMP line that is not JSON") from None
        if not isinstance(msg, dict):
            raise QmpError("qemu sent a QMP message that is not an object")
        return msg

    async def execute(self, command: str, arguments: dict[str, Any] | None = None, *, fd: int | None = None) -> Any:
        """Run one command; its `return` value, or QmpError with qemu's description. `fd`: a file descriptor
        sent with it (SCM_RIGHTS), for `getfd` and `add-fd`: a file the agent opened, so a VMM running as its
        own user never needs the right to open it."""
        req: dict[str, Any] = {"execute": command}
        if arguments:
            req["arguments"] = arguments
        data = json.dumps(req).encode() + b"\n"
        try:
            if fd is None:
                self._writer.write(data)
                await self._writer.drain()
            else:
                await self._writer.drain()  # nothing of ours may sit in the transport ahead of this message
                self._send_with_fd(data, fd)
        except ConnectionError:
            raise QmpError("qemu closed the QMP connection") from None
        while True:
            msg = await self._read()
            if "event" in msg:
                continue
            if "error" in msg:
                err = msg["error"]
                desc = err.get("desc", "unknown error") if isinstance(err, dict) else str(err)
                raise QmpError(f"qemu refused {command}: {desc}")
            if "return" in msg:
                return msg["return"]

    def _send_with_fd(self, data: bytes, fd: int) -> None:
        """One sendmsg of the whole line with `fd` attached, on a duplicate of the connection's socket (the
        transport has no sendmsg). A QMP line is far below the socket buffer, so it does not block."""
        raw = self._writer.get_extra_info("socket")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM, fileno=os.dup(raw.fileno()))
        try:
            sent = sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))])
        finally:
            sock.close()
        if sent != len(data):
            raise QmpError(f"qemu took {sent} of {len(data)} bytes of a command with a file descriptor")

    async def closed(self, within_s: float) -> bool:
        """Wait up to `within_s` for qemu to hang up (it exited); True when it did."""
        try:
            async with asyncio.timeout(within_s):
                while await self._reader.read(65536):
                    pass
            return True
        except ConnectionError:
            return True
        except TimeoutError:
            return False

    async def close(self) -> None:
        self._writer.close()
        try:
            await self._writer.wait_closed()
        except (ConnectionError, OSError):
            pass

    async def __aenter__(self) -> QmpClient:
        return self

    async def __aexit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        await self.close()
