"""Which operator a write is made for: set once per Admin call, read once by the events log; and the roles.

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
from dataclasses import dataclass

# The roles live here, beside the acting operator, rather than with the operator accounts
# (`bc.control.trust.operators`): the quorum's rules (`bc.control.quorum.spec_changes`) weigh a caller's role, and the
# accounts depend on the quorum (a revocation must not lock it), so the roles sit below both.
ROLES = ("viewer", "operator", "admin")
"""In order: each role may do everything the ones before it may."""
RANK = {role: i for i, role in enumerate(ROLES)}


@dataclass(frozen=True)
class Caller:
    """An authenticated operator and its role (`bc.control.trust.operators.authorize`)."""

    name: str
    role: str


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
