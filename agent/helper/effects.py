"""Carrying out a plan as root: files whole or not at all, kernel attributes in place, commands without a shell.

Effects run in order and the first failure stops the rest (an OSError whose
message the server returns, or `Refused` from a check that needs the disk:
the update operations', in `update_effects`). Blocking work goes through the
offload; commands through the runner (`run_process` on a host, `FakeRunner`
under `--fake-commands`). A stream (`kmsg.follow`) is the server's own
(agent.helper.follow), never a plan carried out here.
"""

from __future__ import annotations

from typing import Any

from agent.converge.host_ops import RunProcess
from agent.helper import update_effects
from agent.helper.plans import (
    FollowKmsg,
    Plan,
    Remove,
    Reply,
    Run,
    UpdateInstall,
    UpdateRemember,
    UpdateStage,
    UpdateStep,
    Write,
    WriteInPlace,
)
from agent.hw import cdi
from agent.offload import Offload

COMMAND_TIMEOUT_S = 120.0


class EffectFailed(OSError):
    """An effect of a valid request failed (a command exited non-zero, a write failed)."""


async def carry_out(plan: Plan, *, run: RunProcess, offload: Offload) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for effect in plan:
        if isinstance(effect, Write):
            await offload(cdi.atomic_write, effect.path, effect.data, effect.mode)
        elif isinstance(effect, WriteInPlace):
            await offload(_write_in_place, effect)
        elif isinstance(effect, Remove):
            result["removed"] = await offload(cdi.remove_file, effect.path)
        elif isinstance(effect, Run):
            res = await run(list(effect.argv), timeout_s=COMMAND_TIMEOUT_S)
            if res.returncode != 0:
                raise EffectFailed(f"{' '.join(effect.argv)} exited {res.returncode}: {res.tail(300)}")
        elif isinstance(effect, Reply):
            result.update(effect.value)
        elif isinstance(effect, UpdateStage | UpdateInstall | UpdateStep | UpdateRemember):
            result.update(await offload(update_effects.carry, effect))
        elif isinstance(effect, FollowKmsg):
            raise EffectFailed("kmsg.follow is a stream, not an operation with one reply")
    return result


def _write_in_place(effect: WriteInPlace) -> None:
    with effect.path.open("w", encoding="ascii") as f:
        f.write(effect.text)
