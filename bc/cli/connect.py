"""A CLI command's one connection to `bc serve`: open the Admin client, run the call, say when it is slow.

The client itself (`bc.client.admin`) prints nothing and knows no terminal; these two are the CLI's way of
using it (a fresh event loop per command, progress on stderr through `bc.cli.render.with_progress`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from bc.cli.render import with_progress
from bc.client.admin import AdminClient

_T = TypeVar("_T")


def run_client(fn: Callable[[AdminClient], Awaitable[_T]]) -> _T:
    """Run `fn` with a fresh client to the server the operator config names (a command's one connection)."""
    client = AdminClient.discover()

    async def go() -> _T:
        async with client:
            return await fn(client)

    return asyncio.run(go())


def slow(client: AdminClient, aw: Awaitable[_T]) -> Awaitable[_T]:
    """`aw`, saying on stderr when the server is slow to answer."""
    return with_progress(aw, f"waiting for bc serve at {client.server}…")
