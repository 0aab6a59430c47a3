"""The agent's side of the helper: one call, one reply, as a typed error when it is not done.

Every failure is a `HelperError` (an OSError, so the convergers' retryable
path takes it: the section stays PROGRESSING, nothing is released) whose
message starts `helper:` — the helper is down, refused the request, or the
operation failed as root. A stream operation (`kmsg.follow`) is `stream`: an
async iterator of the helper's frames, which ends when the helper closes.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from agent.helper import ops, wire

CALL_TIMEOUT_S = 180.0  # a helper command may take its own 120 s, plus the wait for the lock


class HelperError(OSError):
    """The helper could not be reached, refused, or failed; the message starts `helper:`."""


class HelperUnavailable(HelperError):
    """The helper's socket cannot be reached (the helper is down): retry later."""


class HelperRefused(HelperError):
    """The helper refused the request or its operation failed."""


class HelperClient:
    def __init__(self, socket_path: Path, *, timeout_s: float = CALL_TIMEOUT_S) -> None:
        self.socket_path = socket_path
        self.timeout_s = timeout_s

    async def call(self, op: str, *, timeout_s: float | None = None, **args: Any) -> dict[str, Any]:
        """The operation's result; HelperError when it was not done. `timeout_s`: this call's own bound (a
        package install takes longer than the default)."""
        limit = timeout_s or self.timeout_s
        try:
            async with asyncio.timeout(limit):
                return await self._call({"v": ops.VERSION, "op": op, **args})
        except TimeoutError:
            raise HelperUnavailable(f"helper: {op} got no answer within {limit:.0f} s") from None

    async def _call(self, request: dict[str, Any]) -> dict[str, Any]:
        op = request["op"]
        try:
            reader, writer = await asyncio.open_unix_connection(str(self.socket_path))
        except OSError as e:
            raise HelperUnavailable(f"helper: cannot reach {self.socket_path}: {e.strerror or e}") from None
        try:
            await wire.write_frame(writer, request)
            reply = await wire.read_frame(reader)
        except (OSError, asyncio.IncompleteReadError, wire.WireError) as e:
            raise HelperUnavailable(f"helper: {op}: the connection broke ({type(e).__name__})") from None
        finally:
            writer.close()
            try:
                await writer.wait_closed()
            except OSError:
                pass
        if reply.get("ok") is True and isinstance(reply.get("result"), dict):
            return dict(reply["result"])
        raise HelperRefused(f"helper: {reply.get('error') or 'an answer that is not one'}")

    async def stream(self, op: str, **args: Any) -> AsyncIterator[dict[str, Any]]:
        """Each result the helper streams for `op`, until it closes the connection; HelperError as `call`."""
        try:
            reader, writer = await asyncio.open_unix_connection(str(self.socket_path))
        except OSError as e:
            raise HelperUnavailable(f"helper: cannot reach {self.socket_path}: {e.strerror or e}") from None
        try:
            await wire.write_frame(writer, {"v": ops.VERSION, "op": op, **args})
            while True:
                try:
                    reply = await wire.read_frame(reader)
                except asyncio.IncompleteReadError:
                    raise HelperUnavailable(f"helper: {op}: the helper closed the stream") from None
                except (OSError, wire.WireError) as e:
                    raise HelperUnavailable(f"helper: {op}: the connection broke ({type(e).__name__})") from None
                if reply.get("ok") is not True or not isinstance(reply.get("result"), dict):
                    raise HelperRefused(f"helper: {reply.get('error') or 'an answer that is not one'}")
                yield dict(reply["result"])
        except OSError as e:
            if isinstance(e, HelperError):
                raise
            raise HelperUnavailable(f"helper: {op}: the connection broke ({type(e).__name__})") from None
        finally:
            writer.close()
            try:
                await writer.wait_closed()
            except OSError:
                pass
