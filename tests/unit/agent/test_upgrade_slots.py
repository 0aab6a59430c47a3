"""The slots on a real directory match the pure model after every step, so a kill -9 between any two steps
leaves on disk exactly the state the model's kill-point tests start from; and the install dir is found only
through a `current` link to a slot."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agent.upgrade.slots import Slots, install, install_dir_of, read_disk
from agent.upgrade.swap_rules import FORWARD, ROLLBACK, Plan, Step, run_steps

PLAN = Plan(command_id="c1", version="1.1.0", sequence=2, deadline=100.0)


async def steps_on_disk(tmp: Path, steps: tuple[Step, ...]) -> Slots:
    install(tmp, b"old", version="1.0.0")
    slots = Slots(tmp)
    disk = await slots.read()
    for step in steps:
        disk = await slots.take(disk, step, PLAN)
        if step is Step.STAGE:
            slots.partial_path(disk).write_bytes(b"new")  # the download
    return slots


@pytest.mark.parametrize("k", range(len(FORWARD) + len(ROLLBACK) + 1))
async def test_the_disk_matches_the_model_after_every_step(tmp_path: Path, k: int) -> None:
    steps = (FORWARD + ROLLBACK)[:k]
    await steps_on_disk(tmp_path, steps)
    fresh = read_disk(tmp_path)
    install(tmp_path / "model", b"old", version="1.0.0")
    model = run_steps(read_disk(tmp_path / "model"), steps, PLAN)
    assert fresh == model
    # exactly one binary is named, and it is whole
    target = os.readlink(tmp_path / "current")
    assert target in ("bc.a", "bc.b") and (tmp_path / target).read_bytes() in (b"old", b"new")
    assert not (tmp_path / "current.new").exists()


def test_the_install_dir_is_found_only_through_current(tmp_path: Path) -> None:
    install(tmp_path, b"old", version="1.0.0")
    assert install_dir_of(str(tmp_path / "current")) == tmp_path
    assert install_dir_of(str(tmp_path / "bc.a")) is None  # run directly: no link to swap
    os.symlink("/usr/bin/env", tmp_path / "elsewhere")
    assert install_dir_of(str(tmp_path / "elsewhere")) is None
    (tmp_path / "x").mkdir()
    os.symlink("/usr/bin/env", tmp_path / "x" / "current")
    assert install_dir_of(str(tmp_path / "x" / "current")) is None
