"""`TypescriptUpload`: what the pty wrote goes up in order, in bounded chunks, at most `limit` bytes, the last chunk
marked done; a refusal ends the recording and is kept to be said."""

from __future__ import annotations

import asyncio

from bc.cli.typescript_upload import TypescriptUpload
from bc.errors import Conflict


class Store:
    def __init__(self, refuse_after: int = -1) -> None:
        self.calls: list[tuple[int, bytes, bool]] = []
        self.held = b""
        self.refuse_after = refuse_after

    async def upload(self, offset: int, data: bytes, done: bool) -> int:
        assert offset == len(self.held)
        if 0 <= self.refuse_after <= len(self.calls):
            raise Conflict("a typescript is at most 1 MiB")
        self.calls.append((offset, data, done))
        self.held += data
        return len(self.held)


async def test_chunks_in_order_bounded_and_the_last_marked_done() -> None:
    s = Store()
    up = TypescriptUpload(s.upload, limit=1000, chunk=64)
    task = asyncio.create_task(up.run())
    up.feed(b"a" * 100)
    up.feed(b"b" * 1000)  # over the limit: 900 kept, 100 dropped
    up.close()
    await asyncio.wait_for(task, 5)
    assert s.held == b"a" * 100 + b"b" * 900
    assert all(len(d) <= 64 for _o, d, _done in s.calls)
    assert [done for *_x, done in s.calls] == [False] * (len(s.calls) - 1) + [True]
    assert up.dropped == 100 and up.sent == up.fed == 1000 and up.error is None


async def test_nothing_fed_still_marks_it_done() -> None:
    s = Store()
    up = TypescriptUpload(s.upload)
    task = asyncio.create_task(up.run())
    up.close()
    await asyncio.wait_for(task, 5)
    assert s.calls == [(0, b"", True)]


async def test_a_refusal_ends_the_recording_and_is_kept() -> None:
    s = Store(refuse_after=1)
    up = TypescriptUpload(s.upload, chunk=10)
    task = asyncio.create_task(up.run())
    up.feed(b"x" * 35)
    up.close()
    await asyncio.wait_for(task, 5)
    assert isinstance(up.error, Conflict) and s.held == b"x" * 10
