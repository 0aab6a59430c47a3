"""One instance's state machine: from what the runtime shows to what the spec wants, as a list of steps.

Pure. `plan(desired, observed)` returns the runtime calls that take a domain
from `observed` (`ABSENT` when the runtime does not list it, else RUNNING,
PAUSED or STOPPED) to `desired` (RUNNING, PAUSED, STOPPED, or DELETED, which
ends ABSENT). The table, every cell of it:

| observed \\ desired | RUNNING          | PAUSED                 | STOPPED | DELETED |
| ------------------- | ---------------- | ---------------------- | ------- | ------- |
| ABSENT              | define, start    | define, start-paused   | define  | -       |
| STOPPED             | define, start    | define, start-paused   | -       | delete  |
| RUNNING             | -                | pause                  | stop    | delete  |
| PAUSED              | resume           | -                      | stop    | delete  |

`define` before a start rewrites the record of a stopped domain from the
current spec (vCPUs, memory, boot files), so a change reaches the next boot.
A resume is not a start: only `start` and `start-paused` pass host admission
(agent.instances.admission). `apply` is the model the property tests run the
plan against: every plan ends in the desired state.
"""

from __future__ import annotations

from typing import Final

from agent.instances.runtime import PAUSED, RUNNING, STOPPED
from bc.protocol.instance_rules import DELETED

ABSENT: Final = "ABSENT"

DEFINE: Final = "define"
START: Final = "start"
START_PAUSED: Final = "start-paused"
PAUSE: Final = "pause"
RESUME: Final = "resume"
STOP: Final = "stop"
DELETE: Final = "delete"

STARTS: frozenset[str] = frozenset({START, START_PAUSED})
"""The steps that boot a domain, which host admission must allow first."""

_TABLE: dict[tuple[str, str], tuple[str, ...]] = {
    (ABSENT, RUNNING): (DEFINE, START),
    (ABSENT, PAUSED): (DEFINE, START_PAUSED),
    (ABSENT, STOPPED): (DEFINE,),
    (ABSENT, DELETED): (),
    (STOPPED, RUNNING): (DEFINE, START),
    (STOPPED, PAUSED): (DEFINE, START_PAUSED),
    (STOPPED, STOPPED): (),
    (STOPPED, DELETED): (DELETE,),
    (RUNNING, RUNNING): (),
    (RUNNING, PAUSED): (PAUSE,),
    (RUNNING, STOPPED): (STOP,),
    (RUNNING, DELETED): (DELETE,),
    (PAUSED, RUNNING): (RESUME,),
    (PAUSED, PAUSED): (),
    (PAUSED, STOPPED): (STOP,),
    (PAUSED, DELETED): (DELETE,),
}


def plan(desired: str, observed: str) -> tuple[str, ...]:
    """The steps from `observed` to `desired`; ValueError for a state outside the table."""
    try:
        return _TABLE[(observed, desired)]
    except KeyError:
        raise ValueError(f"can't plan from {observed!r} to {desired!r}") from None


def apply(observed: str, step: str) -> str:
    """The state a step leaves a domain in (the model the plan is checked against); ValueError when illegal."""
    legal: dict[str, tuple[set[str], str]] = {
        DEFINE: ({ABSENT, STOPPED}, STOPPED),
        START: ({STOPPED}, RUNNING),
        START_PAUSED: ({STOPPED}, PAUSED),
        PAUSE: ({RUNNING}, PAUSED),
        RESUME: ({PAUSED}, RUNNING),
        STOP: ({RUNNING, PAUSED}, STOPPED),
        DELETE: ({STOPPED, RUNNING, PAUSED}, ABSENT),
    }
    before, after = legal[step]
    if observed not in before:
        raise ValueError(f"can't {step} a domain in state {observed}")
    return after


def final_state(desired: str) -> str:
    """What a domain shows once its plan ran: ABSENT for DELETED, else the desired state."""
    return ABSENT if desired == DELETED else desired
