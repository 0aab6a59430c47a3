"""The helper's framing: a 4-byte big-endian length, then that many bytes of one UTF-8 JSON object.

One request frame, one reply frame; a stream operation (`kmsg.follow`)
answers with one reply frame per item instead, until either side closes. A
reply is `{"ok": true, "result": {...}}` or `{"ok": false, "error": SENTENCE}`. A frame longer than `MAX_FRAME`, bytes
that are not UTF-8 JSON, or JSON that is not an object is a `WireError`, and
the server closes the connection after saying so.
"""

from __future__ import annotations

import asyncio
import json
import struct
from typing import Any

MAX_FRAME = 4 << 20
_LEN = struct.Struct(">I")


class WireError(ValueError):
    """A frame that breaks the format (too long, not JSON, not an object)."""


def encode(obj: dict[str, Any]) -> bytes:
    body = json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()
    if len(body) > MAX_FRAME:
        raise WireError(f"a frame of {len(body)} bytes is over the {MAX_FRAME}-byte limit")
    return _LEN.pack(len(body)) + body


def decode_length(head: bytes) -> int:
    (n,) = _LEN.unpack(head)
    if n > MAX_FRAME:
        raise WireError(f"a frame of {n} bytes is over the {MAX_FRAME}-byte limit")
    return int(n)


def decode_body(body: bytes) -> dict[str, Any]:
    try:
        obj = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise WireError("a frame is not UTF-8 JSON") from None
    if not isinstance(obj, dict):
        raise WireError("a frame is not a JSON object")
    return obj


def decode(frame: bytes) -> dict[str, Any]:
    """One whole frame (tests, and the fuzzer); a stream reads with `read_frame`."""
    if len(frame) < _LEN.size or decode_length(frame[: _LEN.size]) != len(frame) - _LEN.size:
        raise WireError("a frame's length does not match its body")
    return decode_body(frame[_LEN.size :])


async def read_frame(reader: asyncio.StreamReader) -> dict[str, Any]:
    """The next frame; `asyncio.IncompleteReadError` when the peer closed."""
    n = decode_length(await reader.readexactly(_LEN.size))
    return decode_body(await reader.readexactly(n))


async def write_frame(writer: asyncio.StreamWriter, obj: dict[str, Any]) -> None:
    writer.write(encode(obj))
    await writer.drain()
