"""How every Admin RPC runs its work: the operator the call acts for (checked by the role guard), and a
`BcError` turned into the call's status. One base for the servicer and the mixins that hold its RPCs."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

import grpc

from bc.control.base import actor
from bc.errors import BcError
from bc.wire.status import abort_with

T = TypeVar("T")


class AdminCalls:
    async def _call(self, context: grpc.aio.ServicerContext, fn: Callable[[], Awaitable[T]]) -> T:
        return await self._call_as(context, lambda _operator: fn())

    async def _call_as(self, context: grpc.aio.ServicerContext, fn: Callable[[str], Awaitable[T]]) -> T:
        """Like `_call`, handing `fn` the name of the operator the call acts for (checked by `_guard`)."""
        try:
            return await fn(actor.current())
        except BcError as e:
            await abort_with(context, e)
