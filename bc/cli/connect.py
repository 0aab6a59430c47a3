"""A CLI command's one connection to `bc serve`: open the Admin client, run the call, say when it is slow.

The client itself (`bc.client.admin`) prints nothing and knows no terminal; these two are the CLI's way of
using it (a fresh event loop per command, progress on stderr through `bc.cli.render.with_progress`).
"""

from __future__ import annotations

import asyncio
import atexit
import functools
import gc
from collections.abc import Awaitable, Callable
from typing import TypeVar

from bc.cli.render import with_progress
from bc.client.admin import AdminClient

_T = TypeVar("_T")


@functools.cache
def _exit_without_collecting() -> None:
    """End this process without the interpreter's last garbage collections (`gc.freeze` at exit, once). A
    one-shot command's process is about to give its memory back, yet Python's shutdown walks every object the
    imports made (protobuf's descriptors, grpc, click, asyncio) in its collections: 35–60 ms of every `bc`
    call on a loaded 2-core machine, 4–9 ms frozen. What only a reference cycle still holds is not finalized
    then; a command's channel and loop are closed and its output flushed before it, so nothing it needs is."""
    atexit.register(gc.freeze)


def run_client(fn: Callable[[AdminClient], Awaitable[_T]]) -> _T:
    """Run `fn` with a fresh client to the server the operator config names (a command's one connection)."""
    _exit_without_collecting()
    client = AdminClient.discover()

    async def go() -> _T:
        async with client:
            return await fn(client)

    return asyncio.run(go())


def slow(client: AdminClient, aw: Awaitable[_T]) -> Awaitable[_T]:
    """`aw`, saying on stderr when the server is slow to answer."""
    return with_progress(aw, f"waiting for bc serve at {client.server}…")
