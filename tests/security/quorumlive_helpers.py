"""Helpers of the quorumlive security tests: the real CLI against an in-process `bc serve`.

The lab's server runs on the test's loop; `bc_cli` runs the CLI (which makes its own loop) in a thread, so
the server keeps answering while the CLI waits. HOME and BC_CONFIG point into the test's tmp directory.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from bc.cli.main import cli
from tests.integration.conftest import InprocLab


def use_lab_config(lab: InprocLab, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The CLI reaches the lab as `local` (an admin), with HOME inside the test's tmp directory."""
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / ".config"))
    monkeypatch.delenv("BC_DATA_DIR", raising=False)
    monkeypatch.delenv("BC_DEBUG", raising=False)
    monkeypatch.setenv("BC_CONFIG", str(lab.server.operator_config))


async def bc_cli(*args: str) -> Result:
    return await asyncio.to_thread(CliRunner().invoke, cli, list(args), prog_name="bc")
