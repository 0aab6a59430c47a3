"""What a job step's primitive is handed and answers (`bc.jobs.primitives` and `bc.jobs.metal_steps`).

`Ctx` is what a primitive may touch: the step's transaction and the control plane's writers (the bus, the
signer, the Random, the token mint); `Outcome` is how it ended when it did; `Primitive` its three hooks.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from bc.control.base.bus import Bus
from bc.control.signing.signer import Signer
from bc.control.trust.identity import TokenMint
from bc.jobs.model import DepOutcome, NodeSpec
from bc.store import Tx


@dataclass(frozen=True)
class Outcome:
    ok: bool
    error: str | None = None
    cancelled: bool = False  # stopped on a cancel before any effect: the node ends `cancelled`


@dataclass
class Ctx:
    """What a primitive may touch: the step's transaction and the control plane's writers."""

    tx: Tx
    bus: Bus
    signer: Signer
    rng: random.Random
    now_ms: int
    dag_id: str
    requested_by: str
    node: NodeSpec
    detail: dict[str, Any] = field(default_factory=dict)
    deps: tuple[DepOutcome, ...] = ()
    first_error: str | None = None
    tokens: TokenMint | None = None  # join tokens for the nodes a provisioning job waits for (None: no CA here)

    @property
    def subject(self) -> str:
        assert self.node.subject is not None, f"{self.node.kind} {self.node.id} needs a subject"
        return self.node.subject

    def param(self, name: str, default: Any = None) -> Any:
        return self.node.params.get(name, default)


Start = Callable[[Ctx], Awaitable[Outcome | None]]
Check = Callable[[Ctx], Awaitable[Outcome | None]]

DONE = Outcome(True)


@dataclass(frozen=True)
class Primitive:
    start: Start
    check: Check | None = None  # None: `start` always settles the node
    cancel: Callable[[Ctx], Awaitable[Outcome | None]] | None = None
