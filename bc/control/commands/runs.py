"""What an operator asks for, as `RunCommand` and `EnqueueCommands` take it: one path for one command or many.

Each member is the RunCommand fields with the payload as protobuf JSON text.
`run_commands` parses and checks every member exactly as RunCommand always
checked its one command (the kind first, then the payload against the kind),
then enqueues them all in one transaction (`bc.control.commands.queue.enqueue_all`):
all are stored or none is. A refusal of one member of several names it
("command 7 of 100 (inventory.refresh on 'n7'): no node named 'n7'"). At most
`max_enqueue_cmds` (10,000) members a call (`bc.protocol.limits`); the payload
of a fan-out (one text for every node) is parsed once.

What RunCommand does not refuse, EnqueueCommands does not either: a
destructive kind outside a batch is enqueued, and the node decides under its
unbatched allowance (docs/quorum.md), as for a lone `bc cmd run`.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from google.protobuf import any_pb2

from bc.control.base.bus import Bus
from bc.control.commands.queue import (
    DEFAULT_NOT_AFTER_S,
    EnqueueRequest,
    enqueue_all,
    kind_of,
    member,
    payload_from_json,
)
from bc.control.signing.signer import Signer
from bc.errors import UsageError
from bc.protocol import limits
from bc.store import Row, Store


@dataclass(frozen=True)
class RunRequest:
    """What an operator asks for (`RunCommand`, one member of `EnqueueCommands`): the payload as JSON text.

    `not_after_s` 0 is the default (`DEFAULT_NOT_AFTER_S`); an empty idempotency key gets a fresh one.
    """

    node_id: str
    kind: str
    payload_json: str = ""
    not_after_s: float = 0
    min_generation: int = 0
    idempotency_key: str = ""


def enqueue_request(run: RunRequest, requested_by: str, parsed: dict[tuple[str, str], any_pb2.Any]) -> EnqueueRequest:
    """The operator's ask parsed and checked as `EnqueueRequest`; `parsed` caches payloads by (kind, text)."""
    kind_of(run.kind)  # an unknown kind is the clearer error than its payload's
    key = (run.kind, run.payload_json)
    payload = parsed.get(key)
    if payload is None:
        payload = parsed[key] = payload_from_json(run.kind, run.payload_json)
    return EnqueueRequest(
        node_id=run.node_id,
        kind=run.kind,
        payload=payload,
        not_after_s=float(run.not_after_s or DEFAULT_NOT_AFTER_S),
        min_generation=run.min_generation,
        idempotency_key=run.idempotency_key,
        requested_by=requested_by,
    )


async def run_commands(
    store: Store,
    bus: Bus | None,
    signer: Signer,
    runs: Sequence[RunRequest],
    requested_by: str,
    rng: random.Random,
) -> list[Row]:
    """RunCommand (one) and EnqueueCommands (many): each parsed and checked, then all enqueued in one
    transaction or none (`enqueue_all`); the rows in the request's order."""
    if not runs:
        raise UsageError("no commands to enqueue: the request lists none")
    limits.check_count("the command list", len(runs), "max_enqueue_cmds")
    parsed: dict[tuple[str, str], any_pb2.Any] = {}
    reqs = []
    for i, run in enumerate(runs):
        with member(i, len(runs), run.node_id, run.kind):
            reqs.append(enqueue_request(run, requested_by, parsed))
    return await enqueue_all(store, bus, signer, reqs, rng)


__all__ = ["RunRequest", "enqueue_request", "run_commands"]
