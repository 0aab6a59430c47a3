"""The staged binary's own `--version`: read from its first line, compared with the release's version, and run
for real (a script in a temp dir) with a deadline."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.upgrade import version_check
from agent.upgrade.version_check import VersionCheckFailed, mismatch, reported_version

pytestmark = pytest.mark.wall_clock  # real subprocesses: the virtual loop would jump past them


def test_the_version_is_the_last_word_of_the_first_line() -> None:
    assert reported_version("bc 1.4.0\ncommit: abc\nbuilt: x\n") == "1.4.0"
    assert reported_version("") == ""
    assert reported_version("1.4.0\n") == ""  # no program name: not `bc --version`'s shape


def test_a_mismatch_is_one_sentence() -> None:
    assert mismatch("bc 1.4.0\ncommit: abc\n", "1.4.0") is None
    said = mismatch("bc 1.3.9\n", "1.4.0")
    assert said is not None and "'1.3.9', not release version '1.4.0'" in said and "\n" not in said
    assert "'nothing'" in (mismatch("", "1.4.0") or "")


def script(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "bc.b.partial"
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


async def test_it_runs_the_binary_in_its_own_dir(tmp_path: Path) -> None:
    path = script(tmp_path, 'echo "bc 2.0.0"; pwd\n')
    out = await version_check.staged_version_output(path)
    assert out.splitlines() == ["bc 2.0.0", str(tmp_path)]


async def test_a_binary_that_fails_hangs_or_cannot_run_is_refused(tmp_path: Path) -> None:
    with pytest.raises(VersionCheckFailed, match="exited with status 3"):
        await version_check.staged_version_output(script(tmp_path, "exit 3\n"))
    with pytest.raises(VersionCheckFailed, match=r"did not answer --version within 0\.3 s"):
        await version_check.staged_version_output(script(tmp_path, "exec sleep 30\n"), timeout_s=0.3)
    junk = tmp_path / "junk"
    junk.write_bytes(b"\x00\x01not a program")
    junk.chmod(0o755)
    with pytest.raises(VersionCheckFailed, match="does not run"):
        await version_check.staged_version_output(junk)
