"""A node whose journal holds no spec keeps every hold it finds: the rule, pure.

The node never drops an assignment on its own, not even while disconnected
(reference I5). A journal that was lost (wiped, corrupt and moved aside, a
reinstall) holds no spec, so the converge loop runs the empty NodeSpec at
generation 0; releasing what that empty spec lacks would free every live
allocation while the control plane, perhaps unreachable, still counts them
held. So at generation 0 the devices converger releases nothing: it adopts
every hold in the CDI directory (our `bc-*.json` files only) as it is, until
a signed spec arrives. That spec decides like any other: an assignment it
still contains is kept (already held, so nothing is rewritten and nothing is
reported), one it lacks is released, which is a signed spec saying otherwise.
A brand-new node has nothing in its CDI directory and nothing to adopt.

A stored spec always has a generation of at least 1 (the agent takes only a
generation above the one it holds, starting from 0), so generation 0 means
exactly "no spec in the journal".
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from agent.converge.run import CONVERGED, PROGRESSING, SectionResult
from agent.hw.cdi import HeldSpec

NO_SPEC = 0
"""The generation the converge loop runs when the journal holds no spec."""

REASON_JOURNAL_LOST = "JournalLost"

_NAMED = 8
"""Allocation ids named in the status message; the rest are counted."""


def holds_to_keep(held: Mapping[str, HeldSpec], generation: int) -> dict[str, HeldSpec] | None:
    """Without a spec (generation 0): every hold found, kept as it is. With one: None, the spec decides."""
    if generation != NO_SPEC:
        return None
    return dict(sorted(held.items()))


def adopted_status(kept: Mapping[str, HeldSpec], cdi_dir: Path) -> SectionResult:
    """The devices section while holds are adopted: PROGRESSING `JournalLost`, naming them; none is CONVERGED."""
    if not kept:
        return SectionResult(CONVERGED)
    ids = sorted(kept)
    named = ", ".join(ids[:_NAMED]) + (f" and {len(ids) - _NAMED} more" if len(ids) > _NAMED else "")
    holds = "hold" if len(ids) == 1 else "holds"
    return SectionResult(
        PROGRESSING,
        reason=REASON_JOURNAL_LOST,
        message=(
            f"the journal holds no spec: keeping the {len(ids)} {holds} found in {cdi_dir} ({named})"
            " until a signed spec says otherwise"
        ),
    )
