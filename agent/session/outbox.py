"""What the agent has to tell the gateway, handed to whichever session is open.

Producers never touch a session: the converge loop puts the newest status
report here (latest wins), anything that journals an event pokes it, and the
dispatcher sends its command updates through `send`. The session runner takes
from it: it attaches its sender once welcomed, detaches it at its end, and
wakes on `changed` to flush events and the status.

Nothing here is durable and nothing needs to be: results and events are in the
journal, and the next session's Hello and flush carry whatever a closed one
did not; a status is re-sent by every new session (its version starts unsent).

A status that says nothing new is not sent again on the same session: the
drift pass puts one every 10 s, and most repeat the last one but for the ages
of their conditions, from which the control plane already derived each
condition's `since`. Such a report replaces the held one (a new session sends
the freshest ages) without waking the session. At fleet scale this removes
most status frames and status writes (docs/design.md, "Status that says
nothing new").
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from bc.protocol.pb import common_pb2, session_pb2
from bc.protocol.pb.session_pb2 import NodeMessage

log = logging.getLogger("agent.session")

Sender = Callable[[NodeMessage], Awaitable[None]]


def status_key(report: session_pb2.StatusReport) -> bytes:
    """The report as the control plane would store it, ages left out: equal keys say the same thing."""
    if not any(c.age_ms for c in report.conditions):
        return report.SerializeToString(deterministic=True)
    ageless = session_pb2.StatusReport()
    ageless.CopyFrom(report)
    for c in ageless.conditions:
        c.age_ms = 0
    return ageless.SerializeToString(deterministic=True)


class Outbox:
    def __init__(self) -> None:
        self.changed = asyncio.Event()
        self.status: session_pb2.StatusReport | None = None
        self.status_version = 0
        self.inventory = common_pb2.Inventory()
        self.inventory_hash = ""
        self._status_key = b""
        self._sender: Sender | None = None

    # -- producers ---------------------------------------------------------
    def note_inventory(self, inventory: common_pb2.Inventory, inventory_hash: str) -> None:
        """The inventory read at start: what the first Hello names, before any status is put."""
        self.inventory, self.inventory_hash = inventory, inventory_hash

    def put_status(
        self, report: session_pb2.StatusReport, inventory: common_pb2.Inventory, inventory_hash: str
    ) -> None:
        """The newest status and the inventory it was taken with; an older unsent one is replaced.

        Only a report that differs from the last one put in more than its conditions' ages (`status_key`)
        is new: it gets a version and wakes the session.
        """
        self.status, self.inventory, self.inventory_hash = report, inventory, inventory_hash
        key = status_key(report)
        if key == self._status_key:
            return
        self._status_key = key
        self.status_version += 1
        self.changed.set()

    def poke(self) -> None:
        """Something was journaled (an event): the open session flushes it now rather than at its next tick."""
        self.changed.set()

    async def send(self, msg: NodeMessage) -> None:
        """To the open session, if one is welcomed; else nowhere (the journal keeps what must not be lost)."""
        sender = self._sender
        if sender is None:
            return
        try:
            await sender(msg)
        except Exception as e:  # a closed link: the journal keeps what matters
            log.debug("event=outbox.send-failed kind=%s error=%s", msg.WhichOneof("msg"), e)

    # -- the session -------------------------------------------------------
    def attach(self, sender: Sender) -> None:
        self._sender = sender

    def detach(self, sender: Sender) -> None:
        """Only the session that attached detaches: a late end of an old session leaves a new one attached."""
        if self._sender == sender:
            self._sender = None

    @property
    def attached(self) -> bool:
        return self._sender is not None
