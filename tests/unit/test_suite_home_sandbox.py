"""The suite never writes in the operator's HOME or data dir (tests/home_sandbox.py)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from bc.runtime.config import default_data_dir, operator_config_candidates, user_config_path
from tests.home_sandbox import HomeSandbox


def test_the_suite_runs_with_a_scratch_home_data_dir_and_no_bc_config() -> None:
    scratch_root = Path(tempfile.gettempdir())
    assert Path.home().is_relative_to(scratch_root)
    assert user_config_path().is_relative_to(scratch_root)
    assert default_data_dir().is_relative_to(scratch_root)
    assert Path(os.environ["XDG_CONFIG_HOME"]).is_relative_to(scratch_root)
    assert "BC_CONFIG" not in os.environ
    assert all(p.is_relative_to(scratch_root) for p in operator_config_candidates() if "/var/lib/bc" not in str(p))


def test_a_write_to_the_real_config_is_caught_and_the_environment_restored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = tmp_path / "operator-home"
    (real / ".config" / "bc").mkdir(parents=True)
    (real / ".config" / "bc" / "config.json").write_text('{"server": "lab:7443"}')
    monkeypatch.setenv("HOME", str(real))
    monkeypatch.setenv("BC_CONFIG", "/somewhere/else.json")
    box = HomeSandbox.enter()
    try:
        assert box.changes() == []
        assert Path.home() != real and "BC_CONFIG" not in os.environ
        (real / ".config" / "bc" / "config.json").write_text('{"server": "127.0.0.1:40123"}')
        (real / "stray").write_text("")
        changed = box.changes()
        assert any(".config/bc changed" in c for c in changed)
        assert any("gained stray" in c for c in changed)
    finally:
        box.leave()
    assert os.environ["HOME"] == str(real)
    assert os.environ["BC_CONFIG"] == "/somewhere/else.json"
    assert not box.scratch.exists()
