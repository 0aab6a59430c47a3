"""Which exec ticket ids (`jti`) the node still remembers, and whether a new one may be used: pure rules.

Both journals (`agent.journal.Journal`, `agent.memory_journal.MemoryJournal`) keep every used `jti` with its
ticket's expiry and apply `admit` before a tunnel opens, so a ticket opens at most one tunnel, ever, even
across a restart: an expired one is refused by its `exp` anyway, so its `jti` may be forgotten. The set is
bounded: a full set (`MAX_JTIS` live ids) refuses new tickets, saying so, rather than forget a live one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

MAX_JTIS = 10_000
"""Live ticket ids a node keeps at most (delivery.md, the journal's `exec tickets`)."""

REPLAYED = "replayed"
FULL = "jti-set-full"


@dataclass(frozen=True)
class Admission:
    refused: str
    """'' when the ticket may be used; else `REPLAYED` or `FULL`."""
    forget: tuple[str, ...]
    """Ids whose tickets have expired: removed in the same write."""


def admit(used: Mapping[str, int], jti: str, exp_ms: int, now_ms: int, cap: int = MAX_JTIS) -> Admission:
    """May ticket `jti` (expiring at `exp_ms`) be used at `now_ms`, given `used` (jti → expiry, ms)?"""
    forget = tuple(sorted(j for j, exp in used.items() if exp <= now_ms))
    live = len(used) - len(forget)
    if jti in used and used[jti] > now_ms:
        return Admission(REPLAYED, forget)
    if jti in used:  # expired and remembered: its ticket cannot verify any more, but say replayed all the same
        return Admission(REPLAYED, forget)
    if live >= cap:
        return Admission(FULL, forget)
    return Admission("", forget)


def message(refused: str, cap: int = MAX_JTIS) -> str:
    if refused == REPLAYED:
        return "this ticket was used already: each ticket opens one tunnel"
    return f"this node remembers {cap} unexpired tickets already and takes no new one until some expire"
