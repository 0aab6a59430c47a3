"""Which operator a write is made for: set once per Admin call, read once by the events log.

Every write an operator makes through the Admin API publishes its event in the
same transaction, so recording the operator in `events.publish` attributes
every such write, today's and tomorrow's, without threading a name through each
library call. The Admin servicer sets it after it has checked the caller's
certificate and role (`acting`); nothing else does, so the control plane's own
writes (sweeper, liveness, jobs, the gateway) carry no operator. A context
variable is per asyncio task, and gRPC runs every call in its own task, so one
call's operator never leaks into another's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar

_operator: ContextVar[str] = ContextVar("bc_operator", default="")


def current() -> str:
    """The operator this task acts for; "" for the control plane's own work."""
    return _operator.get()


@contextlib.contextmanager
def acting(operator: str) -> Iterator[None]:
    token = _operator.set(operator)
    try:
        yield
    finally:
        _operator.reset(token)
