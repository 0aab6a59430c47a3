"""Shared by the tests/security/test_sec_roles_* files: the threaded `bc serve` lab of the quorum CLI tests
(a real server on 127.0.0.1, the CLI under CliRunner as `local`, an admin), and an operator's own config."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.test_cli_cmd import ok_json
from tests.integration.test_quorum_cli import Lab, operator_config, running_lab

__all__ = ["Lab", "bc_argv", "bc_env", "jobs", "operator_config", "operators", "serve_lab"]


def serve_lab(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Lab]:
    """`bc serve` with n1 and n2 joined (not connected); the CLI acts as `local` unless told otherwise."""
    yield from running_lab(tmp_path, monkeypatch)


def operators() -> dict[str, dict[str, object]]:
    """`bc operators --json` by name."""
    return {str(o["name"]): o for o in ok_json("operators")}


def jobs() -> list[dict[str, object]]:
    """Every job, ended ones too."""
    return list(ok_json("jobs", "list", "--all"))


def bc_env(tmp_path: Path, config: Path) -> dict[str, str]:
    """The environment of a `bc` subprocess acting under `config`: HOME and the rest in tmp_path."""
    home = tmp_path / "sub-home"
    home.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("BC_")}
    env.update(
        HOME=str(home), XDG_CONFIG_HOME=str(home / ".config"), BC_CONFIG=str(config), BC_DATA_DIR=str(home / "data")
    )
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(Path(__file__).parents[2]), env.get("PYTHONPATH", "")) if p)
    return env


def bc_argv(*args: str) -> list[str]:
    """`bc ARGS` as a subprocess of this checkout's interpreter."""
    return [sys.executable, "-m", "bc.cli.main", *args]
