"""What fits in one frame: how the agent packs what it owes the gateway so that no frame is ever refused.

gRPC refuses a frame over the receiver's limit before any handler sees it and
ends the stream; a node that resent that frame on every redial would never be
heard from again. So the agent never writes a frame over its budget
(`max_frame_bytes` of `bc.protocol.limits`, which is below gRPC's default
receive limit), and everything it owes is split to fit:

* `pack_hello` -- Hello carries unacked results, oldest first, while they
  fit; the rest follow as CommandUpdates once the session is welcomed. Every
  journaled update is at most `max_update_bytes` (`journal_rules.fit_update`),
  which is below the smallest budget, so each one fits a frame of its own.
* `pack_events` -- unacked events go in as many EventBatches as it takes.
* `trim_status` -- section and condition messages are cut to `max_text_bytes`.
* `budget_after_refusal` -- the one rule for a gateway that still refuses a
  frame as too large (a peer configured below the table): the stream ends
  with RESOURCE_EXHAUSTED "SERVER: Received message larger than max (X vs.
  Y)", and from then on the agent packs to Y less the headroom, never below
  `min_frame_bytes` (one maximal update or event). The same results go out
  again, in smaller frames, after the usual back-off: the node never loops on
  one frame it cannot send.

Pure: messages in, messages out.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from bc.protocol.limits import FRAME_HEADROOM_BYTES, LIMITS, Limits, truncate_text
from bc.protocol.pb import session_pb2
from bc.protocol.pb.session_pb2 import NodeMessage

# The length prefixes of the enclosing messages (NodeMessage.hello, NodeMessage.event_batch) grow by a byte
# or two as their content grows; this much slack covers them.
PREFIX_SLACK_BYTES = 16

_PEER_REFUSED = re.compile(r"(?:(CLIENT|SERVER): )?Received message larger than max \((\d+) vs\. (\d+)\)")


def _varint_size(n: int) -> int:
    size = 1
    while n >= 0x80:
        n >>= 7
        size += 1
    return size


def field_size(payload_bytes: int) -> int:
    """Bytes one length-delimited field (number below 16) of `payload_bytes` adds to its message."""
    return 1 + _varint_size(payload_bytes) + payload_bytes


def pack_hello(
    hello: NodeMessage, updates: Sequence[session_pb2.CommandUpdate], budget: int
) -> tuple[NodeMessage, list[session_pb2.CommandUpdate]]:
    """`hello` with the unacked results that fit `budget`, oldest first, and the rest to send after Welcome."""
    out = NodeMessage()
    out.CopyFrom(hello)
    size = out.ByteSize() + PREFIX_SLACK_BYTES
    rest: list[session_pb2.CommandUpdate] = []
    for u in updates:
        add = field_size(u.ByteSize())
        if not rest and size + add <= budget:
            out.hello.unacked_results.append(u)
            size += add
        else:
            rest.append(u)  # the settled order holds: once one does not fit, the rest follow it
    return out, rest


def pack_events(journal_id: str, events: Sequence[session_pb2.NodeEvent], budget: int) -> list[session_pb2.EventBatch]:
    """The events in order, in as few EventBatches as fit `budget` each (an event always goes somewhere)."""
    batches: list[session_pb2.EventBatch] = []
    base = NodeMessage(event_batch=session_pb2.EventBatch(journal_id=journal_id)).ByteSize() + PREFIX_SLACK_BYTES
    current = session_pb2.EventBatch(journal_id=journal_id)
    size = base
    for ev in events:
        add = field_size(ev.ByteSize())
        if current.events and size + add > budget:
            batches.append(current)
            current = session_pb2.EventBatch(journal_id=journal_id)
            size = base
        current.events.append(ev)
        size += add
    if current.events:
        batches.append(current)
    return batches


def trim_status(report: session_pb2.StatusReport, limits: Limits = LIMITS) -> session_pb2.StatusReport:
    """A copy of `report` whose section and condition texts are at most `max_text_bytes` each."""
    out = session_pb2.StatusReport()
    out.CopyFrom(report)
    for section in out.sections:
        section.reason = truncate_text(section.reason, limits.max_text_bytes)
        section.message = truncate_text(section.message, limits.max_text_bytes)
    for condition in out.conditions:
        condition.reason = truncate_text(condition.reason, limits.max_text_bytes)
        condition.message = truncate_text(condition.message, limits.max_text_bytes)
    return out


def budget_after_refusal(code: str, details: str, budget: int, limits: Limits = LIMITS) -> int | None:
    """The frame budget after a stream ended `code`/`details`; None when it was not the peer refusing a frame.

    Only the peer's refusal ("SERVER: Received ...", or no side named) lowers it: "CLIENT: Received ..." is
    this agent refusing the gateway's frame, which no budget of ours can help.
    """
    if code != "RESOURCE_EXHAUSTED":
        return None
    m = _PEER_REFUSED.search(details)
    if m is None or m.group(1) == "CLIENT":
        return None
    peer_limit = int(m.group(3))
    return max(limits.min_frame_bytes, min(budget, peer_limit - FRAME_HEADROOM_BYTES))


__all__ = ["budget_after_refusal", "field_size", "pack_events", "pack_hello", "trim_status"]
