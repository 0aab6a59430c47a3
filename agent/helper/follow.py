"""`kmsg.follow` as root: read the kernel log without blocking the loop and send its XID records, one frame each.

The source is `/dev/kmsg` (a character device: each read returns one record,
EAGAIN once none is left, EPIPE when the ring overwrote the next one) or, in
tests, a FIFO under the helper's root (opened read-write, so that no writer is
not an end). Anything else is refused. Each open of /dev/kmsg starts at the
oldest record the kernel still holds, so the agent gets every XID of the boot
it missed (those after the `after_seq` it already has). The loop waits on the
descriptor (`add_reader`); each wake reads what is there, a bounded number of
records at a time. Lines are bounded too: a line longer than `MAX_LINE` is
dropped whole.
"""

from __future__ import annotations

import asyncio
import errno
import os
import stat
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from agent.helper import kmsg

MAX_LINE = 16 << 10
READ_SIZE = 8192
"""One /dev/kmsg record fits (a shorter buffer fails the read with EINVAL)."""
READS_PER_WAKE = 256


class SourceError(OSError):
    """The kernel log cannot be followed at that path; the message is one sentence."""


def open_source(path: Path) -> int:
    """A non-blocking descriptor of the kernel log at `path` (blocking: call it through the offload)."""
    try:
        st = os.stat(path)
    except OSError as e:
        raise SourceError(f"cannot open {path}: {e.strerror or e}") from None
    if stat.S_ISFIFO(st.st_mode):
        mode = os.O_RDWR  # a FIFO with no writer left reads as its end; holding the write side, it never ends
    elif stat.S_ISCHR(st.st_mode):
        mode = os.O_RDONLY
    else:
        raise SourceError(f"{path} is neither the kernel log (a character device) nor a FIFO")
    try:
        return os.open(path, mode | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise SourceError(f"cannot open {path}: {e.strerror or e}") from None


class Lines:
    """Bytes in, whole lines out; a line past MAX_LINE bytes is dropped."""

    def __init__(self) -> None:
        self._buf = b""
        self._skipping = False

    def feed(self, data: bytes) -> list[str]:
        *done, rest = (self._buf + data).split(b"\n")
        if self._skipping and done:
            done, self._skipping = done[1:], False
        if len(rest) > MAX_LINE:
            rest, self._skipping = b"", True
        self._buf = rest
        return [line.decode("utf-8", "replace") for line in done if len(line) <= MAX_LINE]


def _read_some(fd: int) -> tuple[bytes, bool]:
    """What the source holds now, at most READS_PER_WAKE reads of it, and whether that was all of it."""
    chunks: list[bytes] = []
    for _ in range(READS_PER_WAKE):
        try:
            chunk = os.read(fd, READ_SIZE)  # a /dev/kmsg record ends with a newline; a FIFO's lines may span reads
        except BlockingIOError:
            return b"".join(chunks), True
        except OSError as e:
            if e.errno == errno.EPIPE:  # the ring overwrote records before we read them: go on from the next
                continue
            raise
        if not chunk:
            return b"".join(chunks), True
        chunks.append(chunk)
    return b"".join(chunks), False


async def pump(fd: int, after_seq: int, send: Callable[[dict[str, Any]], Awaitable[None]]) -> None:
    """Send each XID record the source holds and gets, after `after_seq`, until cancelled; closes `fd`."""
    loop = asyncio.get_running_loop()
    ready = asyncio.Event()
    lines = Lines()
    loop.add_reader(fd, ready.set)
    try:
        while True:
            ready.clear()
            data, drained = _read_some(fd)  # non-blocking reads of a device or a FIFO: no wait on the loop
            for line in lines.feed(data):
                record = kmsg.xid_record(line)
                if record is not None and kmsg.wanted(record, after_seq):
                    await send(record)
            if drained:
                await ready.wait()  # level-triggered: a record that came after the last read wakes it again
            else:
                await asyncio.sleep(0)  # more is there: let the rest of the helper run first
    finally:
        loop.remove_reader(fd)
        os.close(fd)
